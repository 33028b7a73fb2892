"""Cut a small real trace out of a large one: the header, metadata events, and the events of a run of
ProfilerSteps (host events that start inside the steps, and the device events their runtime calls
launched, matched by correlation id). Used to make the tiny real traces under tests/data/traces, so a
fresh clone without ../shared runs the real-trace and parity tests.

    python tools/cut_trace.py IN.json.gz OUT.json.gz --steps 5-8
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation"}


def cut(doc: dict, first: int, last: int) -> dict:
    events = doc["traceEvents"]
    steps = {int(e["name"].split("#")[1]): e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"}
    start = steps[first]["ts"]
    after = steps.get(last + 1)
    end = after["ts"] if after else steps[last]["ts"] + steps[last]["dur"]
    host = [e for e in events if e.get("ph") != "M" and str(e.get("cat", "")).lower() not in DEVICE_CATEGORIES and start <= e.get("ts", -1) < end]
    correlations = {e.get("args", {}).get("correlation") for e in host} - {None}
    kept = []
    for e in events:
        category = str(e.get("cat", "")).lower()
        if e.get("ph") == "M" or category == "trace":
            kept.append(e)
        elif category in DEVICE_CATEGORIES:
            if e.get("args", {}).get("correlation") in correlations:
                kept.append(e)
        elif start <= e.get("ts", -1) < end:
            kept.append(e)
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--steps", required=True, help="first-last ProfilerStep numbers, e.g. 5-8")
    args = parser.parse_args()
    first, last = (int(x) for x in args.steps.split("-"))
    raw = args.source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    text = json.dumps(cut(doc, first, last), separators=(",", ":")).encode()
    args.target.write_bytes(gzip.compress(text, mtime=0) if args.target.suffix == ".gz" else text)
    print(f"{args.target}: {len(cut(doc, first, last)['traceEvents'])} events, {args.target.stat().st_size} bytes")


if __name__ == "__main__":
    main()
