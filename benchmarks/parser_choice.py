"""Why torchscope parses with msgspec into typed structs: the alternatives, measured on one trace.

    python benchmarks/parser_choice.py [TRACE]        # default: benchmarks/data/50mb/*.json

Each approach runs in a fresh process; printed: wall time of the parse (imports excluded) and peak RSS.
  orjson-dicts      orjson.loads -> a dict per event (what HTA and most tools start from)
  orjson-columns    the same, then numpy columns (ts, dur, interned name/cat ids, correlation) from the dicts
  msgspec-dicts     msgspec.json.decode with no schema -> a dict per event
  msgspec-structs   msgspec typed decode into small structs (args kept as raw JSON), no columns
  polars-json       polars.read_json on the events array (columns straight from JSON, in Rust; if polars is installed)
  torchscope-msgspec  parse_trace with TORCHSCOPE_NO_FASTSCAN=1: streamed 2 MB batches of typed structs, numpy columns
  torchscope        parse_trace: streamed 2 MB batches through the compiled scanner, straight into columns
"""

from __future__ import annotations

import glob
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

APPROACHES = {
    "orjson-dicts": """
import orjson
doc = orjson.loads(open(PATH, 'rb').read())
n = len(doc['traceEvents'])
""",
    "orjson-columns": """
import orjson, numpy as np
doc = orjson.loads(open(PATH, 'rb').read())
ev = doc.pop('traceEvents')
intern = {}
ts = np.fromiter((e.get('ts', np.nan) for e in ev), np.float64, len(ev))
dur = np.fromiter((e.get('dur', np.nan) for e in ev), np.float64, len(ev))
name = np.fromiter((intern.setdefault(e.get('name', ''), len(intern)) for e in ev), np.int32, len(ev))
cat = np.fromiter((intern.setdefault(e.get('cat', ''), len(intern)) for e in ev), np.int32, len(ev))
corr = np.fromiter((e.get('args', {}).get('correlation', -1) for e in ev), np.int64, len(ev))
n = len(ev)
del ev
""",
    "msgspec-dicts": """
import msgspec
doc = msgspec.json.decode(open(PATH, 'rb').read())
n = len(doc['traceEvents'])
""",
    "msgspec-structs": """
import msgspec
from typing import Union
class Event(msgspec.Struct, gc=False):
    ph: str = ''
    cat: str = ''
    name: str = ''
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    ts: float = float('nan')
    dur: float = float('nan')
    id: Union[int, str, None] = None
    args: msgspec.Raw = msgspec.Raw(b'')
class Top(msgspec.Struct):
    traceEvents: list[Event]
doc = msgspec.json.decode(open(PATH, 'rb').read(), type=Top)
n = len(doc.traceEvents)
""",
    "polars-json": """
import polars
data = open(PATH, 'rb').read()
start = data.index(b'[', data.index(b'"traceEvents"'))
events = data[start : data.rindex(b']') + 1]
del data
n = polars.read_json(events, infer_schema_length=None).height
""",
    "torchscope-msgspec": """
import os
from pathlib import Path
from torchscope.trace.parse import parse_trace
os.environ['TORCHSCOPE_NO_FASTSCAN'] = '1'
n = len(parse_trace(Path(PATH)).events)
""",
    "torchscope": """
from pathlib import Path
from torchscope.trace.parse import parse_trace
n = len(parse_trace(Path(PATH)).events)
""",
}

_WRAPPER = """
import resource, sys, time, json
PATH = sys.argv[1]
started = time.perf_counter()
{body}
print(json.dumps({{"s": time.perf_counter() - started, "events": n,
                   "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else (sorted(glob.glob(str(REPO / "benchmarks/data/50mb/*.json"))) or [""])[0]
    if not path or not os.path.exists(path):
        print("no trace: run `python benchmarks/generate.py --case 50mb` or give a path", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    size = os.path.getsize(path) / 1e6
    print(f"{path}: {size:,.0f} MB\n")
    print("| approach | parse s | peak RSS MB | RSS / file size | events |")
    print("|---|---|---|---|---|")
    for name, body in APPROACHES.items():
        # The imports happen before the clock starts.
        imports = "\n".join(line for line in body.splitlines() if line.startswith(("import", "from")))
        rest = "\n".join(line for line in body.splitlines() if not line.startswith(("import", "from")))
        code = imports + "\n" + _WRAPPER.format(body=rest)
        res = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env)
        if res.returncode != 0:
            why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
            print(f"| {name} | {'not installed' if 'ModuleNotFoundError' in why else 'failed: ' + why} | | | |")
            continue
        out = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"| {name} | {out['s']:.2f} | {out['rss_mb']:,.0f} | {out['rss_mb'] / size:.1f}x | {out['events']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
