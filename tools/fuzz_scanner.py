"""Fuzz the compiled scanner (torchscope/trace/_fastscan.c) with damaged real batches, for a sanitizer run.

    tools/fuzz_scanner.sh [SECONDS]      # builds a copy with ASan + UBSan, then runs this file
    python tools/fuzz_scanner.py SECONDS TRACES_DIR

Mutates event batches cut from every trace in ../shared/traces (bytes replaced, deleted, inserted,
surrogate escapes, truncation) and checks that the scanner never crashes and never accepts text msgspec
rejects. The unit tests (tests/unit/test_fastscan.py) check the same contract with hypothesis; this runs
hundreds of thousands of inputs under the sanitizers, which a test run cannot afford.
"""

from __future__ import annotations

import gzip
import random
import sys
import time
from pathlib import Path

from torchscope.trace import fastscan
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.parse import decode_array
from torchscope.trace.stream import EVENT_SEPARATOR
from torchscope.trace.tables import STRING_COLUMNS, EventTable

ALPHABET = b'{}[],:"\\ 0123456789-.eEtrufalsn\x00\x1f\x7f\x80\xbf\xc0\xc3\xed\xf0\xf4\xff'


def seeds(shared: Path) -> list[bytes]:
    out = []
    for path in sorted(shared.rglob("*.json*")):
        data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        start = data.find(b"[", data.find(b'"traceEvents"'))
        cut = EVENT_SEPARATOR.search(data, start + 20_000) if start >= 0 else None
        if cut is not None:  # about 20 KB of whole events
            out.append(b"[" + data[start + 1 : cut.start() + 1] + b"]")
    return out


def _comparable(table: EventTable) -> list[object]:
    return [[table.strings[i] for i in v.tolist()] if name in STRING_COLUMNS else v.tobytes()
            for name, v in table.columns.items()]


def mutate(rng: random.Random, text: bytearray) -> bytes:
    for _ in range(rng.randint(1, 8)):
        if not text:
            text = bytearray(b"[")
        at = rng.randrange(len(text))
        op = rng.random()
        if op < 0.4:
            text[at] = rng.choice(ALPHABET)
        elif op < 0.6:
            del text[at : at + rng.randint(1, 4)]
        elif op < 0.8:
            text[at:at] = bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4)))
        elif op < 0.9:
            text[at:at] = b"\\u" + rng.choice([b"d800", b"dc00", b"D83D", b"0000", b"zz00"])
        else:
            del text[at:]
    return bytes(text)


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    traces = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parents[2] / "shared" / "traces"
    samples = seeds(traces)
    if not samples or not fastscan.available():
        print("needs ../shared/traces and the built scanner", file=sys.stderr)
        return 2
    scanned = [fastscan.BatchScanner(ColumnBuilder(None).interner).scan(s) is not None for s in samples]
    print(f"{len(samples)} seed batches, {sum(scanned)} taken by the scanner as they are")
    rng = random.Random(1)
    inputs = accepted = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = mutate(rng, bytearray(rng.choice(samples)))
        inputs += 1
        builder = ColumnBuilder(None)
        if rng.random() < 0.5:  # the whole array, as a bracketed batch
            batch = fastscan.BatchScanner(builder.interner).scan(text)
        else:  # the events between two offsets of a larger buffer, as the stream hands them over
            start = rng.randrange(len(text) + 1)
            end = rng.randrange(start, len(text) + 1)
            batch = fastscan.BatchScanner(builder.interner).scan(text, (start, end))
            text = b"[" + text[start:end] + b"]"
        if batch is not None:
            accepted += 1
            reference = decode_array(text)
            if reference is None:
                print(f"accepted text msgspec rejects: {text[:200]!r}", file=sys.stderr)
                return 1
            builder.add_scanned(batch, 0)
            other = ColumnBuilder(None)
            other.add(reference[0], reference[1], 0)
            if reference[1] or _comparable(builder.finish([])[0]) != _comparable(other.finish([])[0]):
                print(f"decoded differently from msgspec: {text[:200]!r}", file=sys.stderr)
                return 1
    print(f"{inputs} inputs, {accepted} accepted (each decoded exactly as msgspec does), no crash, nothing invalid accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
