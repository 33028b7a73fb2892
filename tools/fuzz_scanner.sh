#!/usr/bin/env bash
# Build a copy of the tree with AddressSanitizer + UndefinedBehaviorSanitizer and fuzz the scanner in it.
# Usage: tools/fuzz_scanner.sh [SECONDS]   (needs gcc's libasan/libubsan and ../shared/traces)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git -C "$repo" archive HEAD | tar -x -C "$work"
(cd "$work" && CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -O1 -g" \
  LDFLAGS="-fsanitize=address,undefined" python3 setup.py -q build_ext --inplace)
mkdir -p "$work/tools" && cp "$repo/tools/fuzz_scanner.py" "$work/tools/fuzz_scanner.py"
LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
PYTHONPATH="$work" python3 "$work/tools/fuzz_scanner.py" "${1:-60}" "$repo/../shared/traces"
