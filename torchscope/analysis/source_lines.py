"""The line of a recorded Python frame that made a call, read from the user's source where it is at hand.

PyTorch's Python tracer names a frame `train.py(12): step`, 12 being the function's first line
(`co_firstlineno`), or the running line for a frame already active when profiling started: it records
calls, not lines. Which statement allocated the leaking tensor is then only "somewhere in `step`". Where
the analysis runs next to the code (the usual case: `torchscope run`, then the report), the file's syntax
tree tells which statements of that function call the recorded callee (`torch.ones`, `helper`); when
exactly one does, that is the line. Nothing is guessed otherwise: no file (a trace read on another
machine), a file that no longer parses or whose function no longer starts there, a callee called from
two lines, or a callee with no name in the source (a module called as `self.fc(x)`).

Relative frame paths (the tracer cuts off the `sys.path` entry: `train.py` for the script itself) are
looked up under the run's working directory and its script's folder, from the run directory's manifest.
"""

from __future__ import annotations

import ast
import functools
import os
import stat
from pathlib import Path
from typing import Any, Iterator, Optional

from torchscope.analysis.frames import FRAME_PATTERN, climbs, readable
from torchscope.files import read_regular
from torchscope.rundir.manifest import read_manifests

_MAX_SOURCE_BYTES = 4 << 20  # a Python source file beyond this is not the user's training code
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@functools.lru_cache(maxsize=256)
def source_roots(trace_path: str) -> tuple[str, ...]:
    """Folders that relative frame paths of the run holding `trace_path` are relative to: each rank's
    working directory and the folder of its script (`-m module` runs: the working directory)."""
    roots: list[str] = []
    for manifest in read_manifests(Path(trace_path)):
        cwd = manifest.cwd if isinstance(manifest.cwd, str) else None
        command = manifest.command if isinstance(manifest.command, list) else []
        if command and command[0].endswith(".py"):
            roots.append(os.path.dirname(os.path.join(cwd or "", command[0])))
        if cwd:
            roots.append(cwd)
    return tuple(dict.fromkeys(r for r in roots if r))


def frame_at_call(frame: str, callee: str, roots: tuple[str, ...] = ()) -> str:
    """`frame` (a Python-function event's name) with its line moved to the statement that calls
    `callee` (the name of the event it called), where the source says which one; else `frame`."""
    match = FRAME_PATTERN.match(frame)
    name = _callee_name(callee)
    if match is None or name is None:
        return frame
    line = call_line(_locate(match["file"], roots), int(match["line"]), match["func"], name)
    return frame if line is None else f"{match['file']}({line}): {match['func']}"


def function_start(frame: str, roots: tuple[str, ...] = ()) -> str:
    """`frame` named by its function's first line where it was named by its running line (a frame active
    when profiling started), so that one function reads as one site; else `frame`."""
    match = FRAME_PATTERN.match(frame)
    source = _source(path) if match is not None and (path := _locate(match["file"], roots)) is not None else None
    scope = source.function_at(int(match["line"]), match["func"]) if source is not None and match is not None else None
    if match is None or scope is None or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frame
    first = min((scope.lineno, *(d.lineno for d in scope.decorator_list)))
    return f"{match['file']}({first}): {match['func']}"


def call_line(path: Optional[str], first_line: int, function: str, callee: str) -> Optional[int]:
    """The one line of `function` (defined at, or running at, `path:first_line`; `<module>`: the module's
    own code) whose statements call `callee` by that name; None when there is none or more than one, or
    no source."""
    source = _source(path) if path is not None else None
    if source is None:
        return None
    scope = source.tree if function == "<module>" else source.function_at(first_line, function)
    if scope is None:
        return None
    lines = source.call_lines(scope).get(callee, ())
    return next(iter(lines)) if len(lines) == 1 else None


def _callee_name(callee: str) -> Optional[str]:
    """The name the user's code calls `callee` by: `torch.ones` -> `ones`, `helper (train.py:30)` ->
    `helper`; None for a module (`nn.Module: Linear_0` is called through an attribute of any name)."""
    if match := FRAME_PATTERN.match(callee):
        return match["func"] if match["func"].isidentifier() else None
    text = readable(callee)
    if text.startswith("nn.Module:") or not text:
        return None
    name = text.rsplit(".", 1)[-1]
    return name if name.isidentifier() else None


def _locate(file: str, roots: tuple[str, ...]) -> Optional[str]:
    if os.path.isabs(file):
        return file
    if climbs(file):  # a crafted `../../x.py` would lead out of the run's folders
        return None
    return next((os.path.join(root, file) for root in roots if os.path.isfile(os.path.join(root, file))), None)


def _source(path: str) -> Optional[_Source]:
    """`path` parsed, from the cache while the file keeps its modification time and size (a long-lived
    `view` server sees an edited file anew). None (no source line) for anything but a regular file within
    the size bound: the path comes from the trace, and may name a FIFO, a device or a huge file."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_SOURCE_BYTES:
        return None
    return _parsed(path, info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> Optional[_Source]:
    try:
        # The guarded opener again: the file may have been swapped for a FIFO since the stat above.
        text = read_regular(Path(path), _MAX_SOURCE_BYTES)
        return _Source(ast.parse(text, filename=path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


class _Source:
    """A parsed file and what call sites ask of it, each worked out once: a trace asks about the same
    file for many frames, and walking the whole tree per frame cost milliseconds each."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._functions: dict[str, list[ast.AST]] = {}  # in ast.walk order, as a walk per frame found them
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._functions.setdefault(node.name, []).append(node)
        self._calls: dict[int, dict[str, set[int]]] = {}  # id of a scope of `tree` (kept alive by it)

    def function_at(self, line: int, function: str) -> Optional[ast.AST]:
        """The function of that name whose code starts at `line` (its `def`, or its first decorator:
        `co_firstlineno` of a decorated function), else the innermost one that holds `line` (a frame that
        was already running when profiling started is named by its running line)."""
        named: list[Any] = self._functions.get(function, [])
        for node in named:
            if line in (node.lineno, *(d.lineno for d in node.decorator_list)):
                return node
        holding = [node for node in named if node.lineno <= line <= (node.end_lineno or node.lineno)]
        return min(holding, key=lambda node: (node.end_lineno or node.lineno) - node.lineno, default=None)

    def call_lines(self, scope: ast.AST) -> dict[str, set[int]]:
        """The lines of `scope`'s own code that call each name."""
        found = self._calls.get(id(scope))
        if found is None:
            found = {}
            for node in _own_nodes(scope):
                if isinstance(node, ast.Call) and (name := _called(node.func)) is not None:
                    found.setdefault(name, set()).add(node.lineno)
            self._calls[id(scope)] = found
        return found


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope`'s own code: not those of functions, classes and lambdas nested in it (they are
    frames of their own)."""
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, _SCOPES):
            pending.extend(ast.iter_child_nodes(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(node.decorator_list)  # decorators run in the enclosing scope


def _called(func: ast.expr) -> Optional[str]:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None
