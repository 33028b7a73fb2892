#!/usr/bin/env bash
# Creates the benchmark's own virtual environment, benchmarks/.venv-hta, with HolisticTraceAnalysis and
# orjson (the anchors torchscope is compared with). torchscope itself never depends on them.
#   benchmarks/setup.sh            HTA + orjson
#   benchmarks/setup.sh --no-hta   orjson only (for `run.py --skip-hta` when the running Python lacks orjson)
# Environment: PYTHON (interpreter to build the venv from, default python3), BENCH_VENV (venv path).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${BENCH_VENV:-$here/.venv-hta}"
python="${PYTHON:-python3}"
with_hta=1
[ "${1:-}" = "--no-hta" ] && with_hta=0

if [ ! -x "$venv/bin/python" ]; then
    echo "benchmarks/setup.sh: creating $venv" >&2
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if [ "$with_hta" = 1 ]; then
    # HTA does not need torch; should a future HTA ask for it, pin the CPU build this machine provides
    # first (an unpinned torch would pull a multi-GB CUDA build):  "${pip[@]}" torch==2.13.0
    "${pip[@]}" -r "$here/requirements-hta.txt"
    "$venv/bin/python" -c "import hta.trace_analysis, orjson" >/dev/null
    touch "$venv/.hta-installed"
else
    "${pip[@]}" "orjson>=3.9"
fi
touch "$venv/.orjson-installed"
echo "benchmarks/setup.sh: ready: $venv" >&2
