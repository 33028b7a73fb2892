"""Benchmark torchscope's loader and analysis side by side with HTA and the JSON floor.

    python benchmarks/run.py                       # all cases: 50mb,500mb,2gb,ranks8,ranks64
    python benchmarks/run.py --quick               # 50 MB only (a smoke test)
    python benchmarks/run.py --sizes 50mb,ranks8 --skip-hta

For each case it generates the traces once (benchmarks/generate.py, into benchmarks/data/, git-ignored),
then measures each of these in a fresh process, one after the other, with a warm page cache:

  orjson floor         read (+ gunzip) + orjson.loads of each file: the floor for any JSON-based loader
  torchscope load      parse_trace of each file (parse only, no cache)
  torchscope analysis  analyze(path, jobs=N, use_cache=False): load + full analysis + diagnosis
  first cached run     analyze(..., use_cache=True) on an empty cache: analysis + writing the cache
  cached re-analysis   the same again: reads the cache instead of the JSON
  HTA load             TraceAnalysis(trace_dir=...) in benchmarks/.venv-hta (made by setup.sh on demand)

Wall time is the whole process (interpreter start and imports included), ending when wait4 returns; "op" is
the operation alone, as the process timed it. Peak memory is sampled over the whole process tree every 50 ms
on a separate thread (the sum of the PSS of the process and all its descendants: pages that forked workers
share with their parent count once; a lone process's RSS) and checked against wait4's ru_maxrss, the exact
peak RSS of the largest single process; a cell shows the larger. Rank sets are loaded file after file by
the floor and `torchscope load`; the analysis uses --jobs N workers; HTA uses its own process pool.

Prints a markdown table and the targets of issue 3 with PASS/FAIL, and writes benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

import generate  # noqa: E402  (benchmarks/ is not a package)

HTA_VENV = BENCH_DIR / ".venv-hta"
CHILD = BENCH_DIR / "_child.py"
DEFAULT_SIZES = "50mb,500mb,2gb,ranks8,ranks64"
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.05
# Measurements whose first run is shorter than this are repeated (--repeat) and the fastest kept, for every
# tool alike: a run of a second or two on a shared 2-core VM varies by +-30 %.
REPEAT_UNDER_S = 60.0
MiB = 1 << 20

MODES = ("floor", "ts-load", "ts-analyze", "ts-cold", "ts-cached", "hta-load")
LABELS = {
    "floor": "orjson floor",
    "ts-load": "torchscope load",
    "ts-analyze": "torchscope load+analysis",
    "ts-cold": "first cached run (writes cache)",
    "ts-cached": "cached re-analysis",
    "hta-load": "HTA load",
}


# ----------------------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class CaseSpec:
    name: str
    size_mb: int
    ranks: int
    steps: int


def parse_case(text: str) -> CaseSpec:
    """`50mb`, `2gb` (one rank), `ranks8` (8 x 50 MB) or `ranks4x10mb`."""
    text = text.strip().lower()
    if text in generate.CASES:
        c = generate.CASES[text]
        return CaseSpec(c.name, c.size_mb, c.ranks, c.steps)
    single = re.fullmatch(r"(\d+)(mb|gb)", text)
    if single:
        size = int(single.group(1)) * (1000 if single.group(2) == "gb" else 1)
        return CaseSpec(text, size, 1, 5)
    ranks = re.fullmatch(r"ranks(\d+)(?:x(\d+)(mb|gb))?", text)
    if ranks:
        size = int(ranks.group(2) or 50) * (1000 if ranks.group(3) == "gb" else 1)
        return CaseSpec(text, size, int(ranks.group(1)), 5)
    raise argparse.ArgumentTypeError(f"unknown size {text!r} (use e.g. 50mb, 2gb, ranks8, ranks4x10mb)")


# ----------------------------------------------------------------------------------------------------------
# Measuring one process tree


@dataclass
class Measurement:
    case: str
    mode: str
    wall_s: float = float("nan")
    op_s: float = float("nan")
    peak_tree_mb: float = float("nan")
    peak_single_mb: float = float("nan")
    status: str = "ok"
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def peak_mb(self) -> float:
        return max(self.peak_tree_mb, self.peak_single_mb)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(x) for x in handle.read().split())
        except OSError:
            continue
    return found


def _process_memory_bytes(pid: int) -> int:
    """PSS (proportional set size: shared pages split between the processes that map them), so forked
    workers that share their parent's pages are not counted twice; RSS where smaps_rollup is missing."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return _rss_bytes(pid)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def tree_rss_bytes(root: int) -> int:
    """Memory of a process tree: the sum of its processes' PSS (see `_process_memory_bytes`).

    A lone process is read from statm instead (its RSS): reading smaps_rollup walks the process's page
    tables under its memory lock, which slows a process that is faulting pages in, and for one process
    wait4's ru_maxrss (an RSS, and exact) is what its cell shows anyway."""
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid in pids:
            continue
        pids.append(pid)
        stack.extend(_children(pid))
    total = 0
    for pid in pids:
        try:
            total += _rss_bytes(pid) if len(pids) == 1 else _process_memory_bytes(pid)
        except (OSError, IndexError, ValueError):
            continue
    return total


def run_measured(cmd: Sequence[str], env: dict[str, str], timeout_s: float, mem_limit: int,
                 log_path: Path) -> tuple[float, int, int, str, str]:
    """Run `cmd` in its own session; returns (wall s, peak tree RSS, ru_maxrss bytes, status, stdout).

    The wall time ends when wait4 returns (this thread blocks in it); memory is sampled on another
    thread every SAMPLE_S, which also stops a run past `timeout_s` or `mem_limit`."""
    import threading

    with tempfile.TemporaryFile() as out, open(log_path, "ab") as err:
        err.write(f"\n$ {' '.join(cmd)}\n".encode())
        err.flush()
        started = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=env, cwd=REPO, start_new_session=True)
        finished = threading.Event()
        peak, stopped = [0], [""]  # written by the sampler thread

        def sample() -> None:
            while not finished.is_set():
                peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
                elapsed = time.perf_counter() - started
                reason = ("timeout" if elapsed > timeout_s else
                          f"stopped at {mem_limit / 2**30:.0f} GiB" if peak[0] > mem_limit else "")
                if reason:
                    stopped[0] = reason
                    _reap_group(proc.pid)  # the session this call started, and only it
                    return
                finished.wait(SAMPLE_S)

        sampler = threading.Thread(target=sample, name="memory-sampler", daemon=True)
        sampler.start()
        _, wait_status, rusage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        finished.set()
        sampler.join()
        code = os.waitstatus_to_exitcode(wait_status)
        proc.returncode = code
        _reap_group(proc.pid)
        out.seek(0)
        stdout = out.read().decode(errors="replace")
    status = stopped[0] or "ok"
    if status == "ok" and code != 0:
        status = f"failed (exit {code}, see {log_path.name})"
    return wall, peak[0], int(rusage.ru_maxrss) * 1024, status, stdout


def _reap_group(pgid: int) -> None:
    """Kill what is left of the measured process group (e.g. pool workers of a killed run)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------------------------------------
# Environment and set-up


def has_module(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def ensure_setup(need_hta: bool, need_floor: bool = True) -> tuple[str | None, str | None]:
    """(python with HTA or None, python with orjson or None), running setup.sh when they are missing."""
    venv_python = str(HTA_VENV / "bin" / "python")
    if need_hta and not (Path(venv_python).exists() and has_module(venv_python, "hta.trace_analysis")):
        print("benchmarks: setting up the HTA environment (benchmarks/setup.sh)...", file=sys.stderr)
        subprocess.run(["bash", str(BENCH_DIR / "setup.sh")], check=True)
    hta_python = venv_python if need_hta else None
    if not need_floor:
        return hta_python, None
    if Path(venv_python).exists() and has_module(venv_python, "orjson"):
        return hta_python, venv_python
    if has_module(sys.executable, "orjson"):
        return hta_python, sys.executable
    print("benchmarks: installing orjson for the floor (benchmarks/setup.sh --no-hta)...", file=sys.stderr)
    subprocess.run(["bash", str(BENCH_DIR / "setup.sh"), "--no-hta"], check=True)
    return hta_python, venv_python


def ensure_bytecode() -> None:
    """Byte-compile torchscope as `pip install` does for an installed package (HTA's environment has its
    .pyc files from pip). The children import torchscope from the checkout, where Python writes no .pyc
    when PYTHONDONTWRITEBYTECODE is set: every run would then compile ~50 modules from source (~60 ms)."""
    import compileall

    compileall.compile_dir(str(REPO / "torchscope"), quiet=1)


def child_env(cache_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["XDG_CACHE_HOME"] = str(cache_home)  # torchscope's fallback cache location, kept in benchmarks/data
    env.setdefault("PYTHONHASHSEED", "0")
    env.pop("PYTHONSTARTUP", None)
    return env


def warm_page_cache(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(16 * MiB):
                pass


def hta_layout(data_dir: Path, case: str, paths: list[Path]) -> Path:
    """HTA wants a directory holding only rank trace files: symlinks to the generated files."""
    directory = data_dir / "_hta" / case
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for path in paths:
        (directory / path.name).symlink_to(path.resolve())
    return directory


def clear_cache(case_dir: Path, cache_home: Path) -> None:
    shutil.rmtree(case_dir / ".torchscope-cache", ignore_errors=True)
    shutil.rmtree(cache_home / "torchscope", ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# One case


@dataclass
class Context:
    data_dir: Path
    jobs: int
    timeout_s: float
    mem_limit: int
    hta_python: str | None
    floor_python: str | None
    repeat: int
    profile: bool
    log_path: Path

    @property
    def cache_home(self) -> Path:
        return self.data_dir / ".xdg-cache"


def measure(ctx: Context, case: str, mode: str, python: str, args: list[str]) -> Measurement:
    child_mode = "ts-cached" if mode == "ts-cold" else mode
    cmd = [python, str(CHILD), child_mode, *args]
    best: Measurement | None = None
    runs = 1 if mode == "ts-cold" else ctx.repeat
    attempt = 0
    while attempt < runs:
        attempt += 1
        wall, tree, single, status, stdout = run_measured(cmd, child_env(ctx.cache_home), ctx.timeout_s,
                                                          ctx.mem_limit, ctx.log_path)
        m = Measurement(case, mode, wall, peak_tree_mb=tree / MiB, peak_single_mb=single / MiB, status=status)
        for line in stdout.splitlines():
            if line.startswith("BENCH-RESULT "):
                m.detail = json.loads(line.removeprefix("BENCH-RESULT "))
                m.op_s = float(m.detail.pop("op_s", float("nan")))
        if status == "ok" and not m.detail:
            m.status = "failed (no result line)"
        if best is None or (m.ok and (not best.ok or m.wall_s < best.wall_s)):
            best = m
        if attempt == 1 and m.wall_s > REPEAT_UNDER_S:
            break  # a long run varies little relative to its length; repeating it would cost minutes
    assert best is not None
    print(f"  {LABELS[mode]:<34} {_cell(best)}", file=sys.stderr, flush=True)
    return best


def profile_case(ctx: Context, case: str, files: list[str], target: list[str]) -> None:
    """cProfile top entries of torchscope's load and (serial) analysis, for finding hotspots."""
    out = ctx.data_dir / "profiles"
    for mode, args in (("ts-load", files), ("ts-analyze", ["--jobs", "1", *target])):
        path = out / f"{case}-{mode}.txt"
        cmd = [sys.executable, str(CHILD), mode, "--profile", str(path), *args]
        run_measured(cmd, child_env(ctx.cache_home), ctx.timeout_s, ctx.mem_limit, ctx.log_path)
        print(f"  profile written: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", file=sys.stderr)


def run_case(ctx: Context, spec: CaseSpec, skip_hta: bool) -> tuple[dict[str, Any], list[Measurement]]:
    case_dir = ctx.data_dir / spec.name
    paths = generate.generate(case_dir, spec.size_mb, spec.ranks, spec.steps, jobs=2)
    total = sum(p.stat().st_size for p in paths)
    info = {"case": spec.name, "files": len(paths), "bytes": total}
    print(f"case {spec.name}: {len(paths)} file(s), {total / 1e6:,.0f} MB", file=sys.stderr, flush=True)
    warm_page_cache(paths)
    files = [str(p) for p in paths]
    target = [str(case_dir)] if len(paths) > 1 else files
    results: list[Measurement] = []
    if ctx.floor_python:
        results.append(measure(ctx, spec.name, "floor", ctx.floor_python, files))
    results.append(measure(ctx, spec.name, "ts-load", sys.executable, files))
    results.append(measure(ctx, spec.name, "ts-analyze", sys.executable, ["--jobs", str(ctx.jobs), *target]))
    clear_cache(case_dir, ctx.cache_home)
    results.append(measure(ctx, spec.name, "ts-cold", sys.executable, ["--jobs", str(ctx.jobs), *target]))
    results.append(measure(ctx, spec.name, "ts-cached", sys.executable, ["--jobs", str(ctx.jobs), *target]))
    if not skip_hta and ctx.hta_python:
        hta_dir = hta_layout(ctx.data_dir, spec.name, paths)
        results.append(measure(ctx, spec.name, "hta-load", ctx.hta_python, [str(hta_dir)]))
    if ctx.profile:
        profile_case(ctx, spec.name, files, target)
    return info, results


# ----------------------------------------------------------------------------------------------------------
# Report


def _cell(m: Measurement | None) -> str:
    if m is None:
        return "-"
    if not m.ok:
        tail = f" (after {m.wall_s:,.0f} s, {m.peak_mb:,.0f} MB)" if m.wall_s == m.wall_s else ""
        return f"{m.status}{tail}"
    return f"{m.wall_s:,.2f} s / {m.peak_mb:,.0f} MB"


def side_by_side(infos: list[dict[str, Any]], results: list[Measurement]) -> str:
    by = {(m.case, m.mode): m for m in results}
    head = ["case", "size", *(LABELS[m] for m in MODES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for info in infos:
        size = f"{info['files']} x {info['bytes'] / info['files'] / 1e6:,.0f} MB" if info["files"] > 1 else \
            f"{info['bytes'] / 1e6:,.0f} MB"
        cells = [info["case"], size, *(_cell(by.get((info["case"], mode))) for mode in MODES)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(results: list[Measurement]) -> str:
    head = ["case", "measurement", "wall s", "op s", "peak RSS MB (tree)", "max process RSS MB", "status", "detail"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in results:
        detail = ", ".join(f"{k}={v}" for k, v in m.detail.items())
        lines.append(f"| {m.case} | {LABELS[m.mode]} | {m.wall_s:,.2f} | {m.op_s:,.2f} | {m.peak_tree_mb:,.0f} | "
                     f"{m.peak_single_mb:,.0f} | {m.status} | {detail} |")
    return "\n".join(lines)


def targets(results: list[Measurement], infos: Sequence[dict[str, Any]] = ()) -> list[tuple[str, str, str]]:
    """(target, verdict, evidence) for each target of issue 3 that this run measured."""
    by = {(m.case, m.mode): m for m in results}
    sizes = {i["case"]: i["bytes"] for i in infos}
    files = {i["case"]: i["files"] for i in infos}
    cases = list(dict.fromkeys(m.case for m in results))
    out: list[tuple[str, str, str]] = []

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"
    for case in cases:
        ts, hta = by.get((case, "ts-analyze")), by.get((case, "hta-load"))
        if ts and hta:
            if ts.ok and hta.ok:
                speed, mem = hta.wall_s / ts.wall_s, hta.peak_mb / ts.peak_mb
                out.append((f"{case}: load+analysis >= 10x faster than HTA load", verdict(speed >= 10),
                            f"{ts.wall_s:,.2f} s vs {hta.wall_s:,.2f} s: {speed:.1f}x"))
                out.append((f"{case}: load+analysis peak RSS <= 1/4 of HTA's", verdict(mem >= 4),
                            f"{ts.peak_mb:,.0f} MB vs {hta.peak_mb:,.0f} MB: 1/{mem:.1f}"))
            elif ts.ok and not hta.ok:
                out.append((f"{case}: load+analysis vs HTA load", "PASS (HTA did not finish)",
                            f"torchscope {_cell(ts)}; HTA {hta.status}"))
            else:
                out.append((f"{case}: load+analysis vs HTA load", "FAIL", f"torchscope {ts.status}"))
        load, floor = by.get((case, "ts-load")), by.get((case, "floor"))
        if load and floor and load.ok and floor.ok:
            ratio = load.wall_s / floor.wall_s
            out.append((f"{case}: load within 1.5x of the orjson floor's wall time", verdict(ratio <= 1.5),
                        f"{load.wall_s:,.2f} s vs {floor.wall_s:,.2f} s: {ratio:.2f}x"))
            out.append((f"{case}: load peak RSS below the floor's", verdict(load.peak_mb < floor.peak_mb),
                        f"{load.peak_mb:,.0f} MB vs {floor.peak_mb:,.0f} MB"))
    for case in cases:
        ts, size = by.get((case, "ts-analyze")), sizes.get(case)
        if ts and ts.ok and size and files.get(case) == 1:
            ratio = ts.peak_mb * MiB / size
            out.append((f"{case}: load+analysis peak RSS <= about 2x the trace size", verdict(ratio <= 2.2),
                        f"{ts.peak_mb:,.0f} MB for {size / MiB:,.0f} MiB: {ratio:.1f}x"))
    cached = by.get(("500mb", "ts-cached"))
    if cached:
        out.append(("500mb: cached re-analysis under 1 s", verdict(cached.ok and cached.wall_s < 1.0),
                    f"{cached.wall_s:,.2f} s process wall ({cached.op_s:,.2f} s in analyze)"))
    ranks = by.get(("ranks64", "ts-analyze"))
    if ranks:
        out.append(("ranks64: 64 x 50 MB with --jobs 2 under 8 GB peak RSS in total",
                    verdict(ranks.ok and ranks.peak_mb < 8192),
                    f"{ranks.peak_tree_mb:,.0f} MB summed over the process tree "
                    f"(largest single process {ranks.peak_single_mb:,.0f} MB)"))
    return out


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
    except (OSError, AttributeError):
        mem_kb = 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": str(cores), "memory": f"{mem_kb / 2**20:.0f} GiB",
            "os": platform.platform(), "python": platform.python_version()}


def versions(hta_python: str | None, floor_python: str | None) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; out = {}\n"
            "for d in sys.argv[1:]:\n"
            "    try: out[d] = m.version(d)\n"
            "    except Exception: pass\n"
            "print(json.dumps(out))")
    found: dict[str, str] = {}
    for python, dists in ((sys.executable, ["msgspec", "numpy", "rich"]),
                          (floor_python, ["orjson"]), (hta_python, ["HolisticTraceAnalysis", "pandas"])):
        if python:
            res = subprocess.run([python, "-c", code, *dists], capture_output=True, text=True)
            if res.returncode == 0:
                found.update(json.loads(res.stdout))
    sys.path.insert(0, str(REPO))
    try:
        import torchscope

        found["torchscope"] = torchscope.__version__
    except ImportError:
        pass
    return found


def git_state() -> str:
    """The commit measured, and whether torchscope/ had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "torchscope"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    if not dirty:
        return f"commit {head}"
    digest = hashlib.sha1()
    for path in sorted((REPO / "torchscope").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return f"commit {head} with uncommitted changes in torchscope/ (content sha1 {digest.hexdigest()[:12]})"


def render(argv: Sequence[str], infos: list[dict[str, Any]], results: list[Measurement],
           hta_python: str | None, floor_python: str | None, jobs: int, repeat: int = 1) -> str:
    info = machine()
    vers = versions(hta_python, floor_python)
    command = "python benchmarks/run.py " + " ".join(argv)
    rows = targets(results, infos)
    lines = [
        "# torchscope benchmark results",
        "",
        f"- date: {_dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- command: `{command.strip()}`",
        f"- machine: {info['cores']} cores ({info['cpu']}), {info['memory']} RAM, {info['os']}, Python {info['python']}",
        f"- torchscope source: {git_state()}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(vers.items())),
        f"- torchscope analysis with --jobs {jobs}; each cell: process wall time / peak RSS of the process tree,"
        f" the fastest of {repeat} runs where one run takes under {REPEAT_UNDER_S:.0f} s (every tool alike)",
        f"- interpreter: `{sys.executable}`",
        "",
        "## Side by side",
        "",
        side_by_side(infos, results),
        "",
        "## Targets (issue 3)",
        "",
        "| target | verdict | measured |",
        "|---|---|---|",
        *(f"| {t} | {v} | {e} |" for t, v, e in rows),
        "",
        "## All measurements",
        "",
        detail_table(results),
        "",
        "wall s: the whole process, interpreter start and imports included; op s: the operation alone. "
        "peak RSS (tree): sampled every 50 ms, the PSS summed over the process and its children (shared pages "
        "count once; a lone process's RSS); max process RSS: "
        "wait4's ru_maxrss (the largest single process). Cells show the larger of the two. "
        "RSS figures are MiB (2^20 bytes); file sizes are MB (10^6 bytes).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help=f"comma-separated cases (default {DEFAULT_SIZES})")
    parser.add_argument("--quick", action="store_true", help="50 MB only: a smoke test")
    parser.add_argument("--skip-hta", action="store_true", help="do not measure (or install) HTA")
    parser.add_argument("--skip-floor", action="store_true", help="do not measure the orjson floor")
    parser.add_argument("--jobs", type=int, default=2, help="torchscope --jobs for the analysis (default 2)")
    parser.add_argument("--repeat", type=int, default=3,
                        help=f"runs per measurement shorter than {REPEAT_UNDER_S:.0f} s; the fastest is kept (default 3)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement (default 1800)")
    parser.add_argument("--mem-limit-gb", type=float, default=None,
                        help="stop a measurement whose process tree exceeds this (default 85%% of RAM)")
    parser.add_argument("--profile", action="store_true", help="also write cProfile top entries per case")
    parser.add_argument("--data-dir", type=Path, default=generate.DATA_DIR)
    parser.add_argument("--output", type=Path, default=BENCH_DIR / "results.md")
    args = parser.parse_args(argv)
    sizes = "50mb" if args.quick else (args.sizes or DEFAULT_SIZES)
    specs = [parse_case(s) for s in sizes.split(",") if s.strip()]
    hta_python, floor_python = ensure_setup(need_hta=not args.skip_hta, need_floor=not args.skip_floor)
    ensure_bytecode()
    mem_total = os.sysconf("SC_PHYS_PAGES") * PAGE
    mem_limit = int(args.mem_limit_gb * 2**30) if args.mem_limit_gb else int(0.85 * mem_total)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(args.data_dir.resolve(), args.jobs, args.timeout, mem_limit, hta_python, floor_python,
                  max(args.repeat, 1), args.profile, args.data_dir.resolve() / "bench.log")
    infos, results = [], []
    for spec in specs:
        info, measured = run_case(ctx, spec, args.skip_hta)
        infos.append(info)
        results.extend(measured)
        # Written after every case, so a long run that is stopped keeps what it measured.
        args.output.write_text(render(argv, infos, results, hta_python, floor_python, args.jobs, ctx.repeat))
    text = render(argv, infos, results, hta_python, floor_python, args.jobs, ctx.repeat)
    print(text)
    args.output.write_text(text)
    print(f"written: {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
