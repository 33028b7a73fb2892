"""The capture comparison harness: every script of tests/capture_corpus/ runs under plain ``python`` and
under ``torchscope run``, and both must end the same way: exit code (or the signal that ended it), stdout,
stderr without torchscope's own ``torchscope: ...`` lines, and the files written in the working folder.

Both runs use the same folder path (a fresh copy of the corpus each time), so tracebacks and ``__file__``
compare as they are. Names that hold a pid or a time (``tb/<host>_<pid>.<ms>.pt.trace.json``) compare with
their digits masked, and the content of trace files is not compared. Scripts take their arguments from a
``# args: ...`` first line. Most scripts import nothing heavy; the ``torch_*`` ones train a tiny model on
CPU. The cases run two at a time.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "capture_corpus"
SCRIPTS = sorted(p.name for p in CORPUS.glob("*.py"))
MODULES = ["corpus_pkg"]  # run as `-m`, through the console script when installed
RUN_TIMEOUT_S = 180
# torchscope's own lines; one may follow a script's last stderr text that did not end its line.
OURS_ANYWHERE = re.compile(r"torchscope: (warning|error|run directory|the active window)[^\n]*\n", re.MULTILINE)
# Kineto's own lines for a profiler the script starts itself carry a time and a pid: compared masked.
MASKED = re.compile(r"\d+")


@dataclass(frozen=True)
class Ending:
    """How one run ended, as compared."""

    returncode: int
    stdout: str
    stderr: str
    files: dict[str, str | None]  # path (digits masked where they vary) -> content digest (None: not compared)


def _args_of(script: Path) -> list[str]:
    first = script.read_text(encoding="latin-1").splitlines()[:1]
    return shlex.split(first[0].removeprefix("# args:")) if first and first[0].startswith("# args:") else []


def _snapshot(folder: Path) -> dict[str, str | None]:
    files: dict[str, str | None] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(folder))
        if ".pt.trace.json" in name or name.endswith(".json") and re.search(r"\d{6,}", name) or "/run" in name:
            files[MASKED.sub("#", name)] = None  # traces and run folders: names with pids and times
        else:
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def _run(command: list[str], folder: Path, environ: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    env.pop("TORCHSCOPE_CACHE_DIR", None)
    return subprocess.run(command, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace", timeout=RUN_TIMEOUT_S)


def _ending(result: subprocess.CompletedProcess[str], folder: Path, drop_ours: bool) -> Ending:
    stderr = OURS_ANYWHERE.sub("", result.stderr) if drop_ours else result.stderr
    lines = stderr.splitlines(keepends=True)
    lines = [MASKED.sub("#", line) if line.startswith("USDT:") else line for line in lines]
    return Ending(result.returncode, result.stdout, "".join(lines), _snapshot(folder))


def _torchscope() -> list[str]:
    console = Path(sys.executable).with_name("torchscope")
    return [str(console)] if console.is_file() else [sys.executable, "-m", "torchscope"]


def compare(target: str, kind: str, workdir: Path, environ: Mapping[str, str]) -> tuple[Ending, Ending]:
    """(plain python's ending, torchscope run's ending) of one corpus script or module, started from
    `environ` (a copy of os.environ taken on the main thread: pytest changes os.environ while the worker
    threads run, and reading it there can raise KeyError mid-iteration)."""
    folder = workdir / "work"
    runs = workdir / "runs"  # outside the compared folder
    head = ["-m", target] if kind == "module" else ["./" + target]
    args = [] if kind == "module" else _args_of(CORPUS / target)
    endings = []
    for ours in (False, True):
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(CORPUS, folder, ignore=shutil.ignore_patterns("__pycache__"))
        command = ([*_torchscope(), "run", "--no-report", "--out", str(runs), "--", *head, *args] if ours
                   else [sys.executable, *head, *args])
        if ours and kind == "module":
            command = [*_torchscope(), "run", "--no-report", "--out", str(runs), *head]
        endings.append(_ending(_run(command, folder, environ), folder, drop_ours=ours))
    return endings[0], endings[1]


CASES = [(name, "script") for name in SCRIPTS] + [(name, "module") for name in MODULES]


@pytest.fixture(scope="module")
def all_endings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[tuple[Ending, Ending]]]]:
    environ = dict(os.environ)
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: pool.submit(compare, name, kind, tmp_path_factory.mktemp(re.sub(r"\W", "_", name)), environ)
               for name, kind in CASES}


def test_the_corpus_has_at_least_40_scripts() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize(("name", "kind"), CASES, ids=[name for name, _ in CASES])
def test_a_script_ends_the_same_under_torchscope_run(name: str, kind: str,
                                                     all_endings: dict[str, Future[tuple[Ending, Ending]]]) -> None:
    plain, profiled = all_endings[name].result()
    assert profiled.returncode == plain.returncode, profiled.stderr
    assert profiled.stdout == plain.stdout
    assert profiled.stderr == plain.stderr
    assert profiled.files == plain.files
