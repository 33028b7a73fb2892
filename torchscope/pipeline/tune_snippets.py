"""The code change that makes a measured fix permanent, diff-like, for `torchscope tune`.

A keyword fix (DataLoader, optimizer, `zero_grad`) is shown against the user's own call where the trial
recorded it (capture/interventions.py's call sites): the call is found in the file's syntax tree at that
line, its keywords set, and the lines shown as `- old` / `+ new`. Where the site is not a readable
Python file, or the call cannot be found, a generic snippet says what to add. A torch flag is a line at
the start of the script; `torch.set_num_threads`, where the script calls it itself (the trial ignored those
calls), is that call with the new count.
"""

from __future__ import annotations

import ast
from typing import Callable, Mapping, Optional, Sequence

from torchscope.capture.interventions import autocast_dtype, is_autocast, is_compile, label
from torchscope.report.model import Fix

_EXCLUSIVE = {"fused": "foreach", "foreach": "fused"}


def code_change(fixes: Sequence[Fix], sites: Mapping[str, Sequence[str]]) -> list[str]:
    """Lines of the change for `fixes`; `sites`: the call sites ("file:line") each fix reached, by
    `interventions.label(fix)`."""
    groups = {
        "DataLoader": [f for f in fixes if f.kind == "dataloader_kwarg"],
        "optimizer": [f for f in fixes if f.kind == "optimizer_kwarg"],
        "zero_grad": [f for f in fixes if _is_zero_grad(f)],
    }
    lines: list[str] = []
    for what, group in groups.items():
        if not group:
            continue
        wanted = {"set_to_none": True} if what == "zero_grad" else {f.target: f.value for f in group}
        places = sorted({site for f in group for site in sites.get(label(f), [])})
        changes = [change for change in (_at_site(site, wanted, what) for site in places) if change is not None]
        lines += [line for change in changes for line in change] or [f"+ {_generic(what, wanted)}"]
    for fix in fixes:
        if fix.kind == "code_change" and fix.target == "channels_last":
            lines.append("+ model = model.to(memory_format=torch.channels_last)  # and each 4-D input: "
                         "x = x.to(memory_format=torch.channels_last)")
        if is_autocast(fix):
            call = str(fix.value) if str(fix.value).startswith("torch.autocast(") else \
                f"torch.autocast(device_type, dtype=torch.{autocast_dtype(fix)})"
            lines += _wrapped(sites.get(label(fix), []), f"with {call}:") or \
                [f"+ with {call}:  # around forward and loss, not backward"]
        if is_compile(fix):
            lines += [line for site in sorted(sites.get(label(fix), [])) for line in _compile_at(site)] or \
                ["+ model = torch.compile(model)  # once, after the model is built, before the training loop"]
        if fix.kind == "torch_flag" and fix.target == "torch.set_num_threads":
            own = [change for site in sorted(sites.get(label(fix), [])) if (change := _threads_at(site, fix.value))]
            lines += [line for change in own for line in change] or [f"+ {fix.target}({fix.value!r})"]
        elif fix.kind == "torch_flag":
            lines.append(f"+ {fix.target} = {fix.value!r}")
    return lines


def _threads_at(site: str, threads: object) -> Optional[list[str]]:
    """The script's own `set_num_threads(...)` call at `site` with `threads` instead, or None."""
    def find(tree: ast.AST, line: int) -> Optional[ast.Call]:
        return next((node for node in ast.walk(tree) if isinstance(node, ast.Call) and _name(node) == "set_num_threads"
                     and node.lineno <= line <= (node.end_lineno or node.lineno)), None)

    def rewrite(source: str, call: ast.Call) -> str:
        return f"{ast.get_source_segment(source, call.func) or ast.unparse(call.func)}({threads!r})"

    return _call_replaced(site, find, rewrite)


def _wrapped(places: Sequence[str], opener: str) -> list[str]:
    """Each one-line site (file:line) indented under `opener` (a `with` block)."""
    lines: list[str] = []
    for site in sorted(places):
        path, _, number = site.rpartition(":")
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read().splitlines()[int(number) - 1]
        except (OSError, ValueError, IndexError, UnicodeDecodeError):
            continue
        indent = text[:len(text) - len(text.lstrip())]
        lines += [f"--- {site}", f"- {text}", f"+ {indent}{opener}", f"+ {indent}    {text.lstrip()}"]
    return lines


def _compile_at(site: str) -> list[str]:
    """`name = torch.compile(name)` after the last assignment of the model's name before the line that
    calls it (`site`; the name is the callee there, e.g. `model` in `loss = model(x).mean()`), else at
    that line. Empty where the file or the call cannot be read."""
    path, _, number = site.rpartition(":")
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        tree = ast.parse(source)
        line = int(number)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    # A call of a (dotted) name, the innermost first: `model` in `criterion(model(x), y)`.
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
             and _dotted(node.func)]
    if not calls:
        return []
    callee = ast.unparse(min(calls, key=lambda c: ((c.end_lineno or c.lineno) - c.lineno, -c.col_offset)).func)
    text = source.splitlines()
    assigned = [node for node in ast.walk(tree) if isinstance(node, ast.Assign) and node.lineno < line
                and any(ast.unparse(t) == callee for t in node.targets)]
    at = max(assigned, key=lambda n: n.lineno, default=None)
    if at is None or at.end_lineno is None:
        indent = text[line - 1][:len(text[line - 1]) - len(text[line - 1].lstrip())]
        return [f"--- {path}:{line}", f"+ {indent}{callee} = torch.compile({callee})  # once, before the loop",
                f"  {text[line - 1]}"]
    indent = text[at.lineno - 1][:at.col_offset]
    return [f"--- {path}:{at.lineno}", *(f"  {t}" for t in text[at.lineno - 1:at.end_lineno]),
            f"+ {indent}{callee} = torch.compile({callee})"]


def _dotted(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and _dotted(node.value))


def _is_zero_grad(fix: Fix) -> bool:
    return fix.kind == "code_change" and fix.target.startswith("optimizer.zero_grad")


def _generic(what: str, wanted: Mapping[str, object]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in wanted.items())
    if what == "zero_grad":
        return "optimizer.zero_grad(set_to_none=True)"
    return f"{what}(..., {args})" if what == "DataLoader" else f"torch.optim.<Optimizer>(..., {args})"


def _at_site(site: str, wanted: Mapping[str, object], what: str) -> Optional[list[str]]:
    return _call_replaced(site, lambda tree, line: _call_at(tree, line, what),
                          lambda source, call: _with_keywords(source, call, wanted))


def _call_replaced(site: str, find: Callable[[ast.AST, int], Optional[ast.Call]],
                   rewrite: Callable[[str, ast.Call], str]) -> Optional[list[str]]:
    """`- old` / `+ new` lines for the call `find` picks at `site` ("file:line"), rewritten on one line by
    `rewrite`; None where the file cannot be read or parsed or holds no such call."""
    path, _, line_text = site.rpartition(":")
    if not path.endswith(".py") or not line_text.isdigit():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    call = find(tree, int(line_text))
    if call is None or call.end_lineno is None or call.end_col_offset is None:
        return None
    old_lines = source.splitlines()[call.lineno - 1:call.end_lineno]
    prefix = old_lines[0][:call.col_offset]
    suffix = old_lines[-1][call.end_col_offset:]
    return [f"--- {path}:{call.lineno}", *(f"- {text}" for text in old_lines), f"+ {prefix}{rewrite(source, call)}{suffix}"]


def _call_at(tree: ast.AST, line: int, what: str) -> Optional[ast.Call]:
    """The smallest call spanning `line` that fits `what`: a `zero_grad` call, or a class construction
    (a capitalised callee: the DataLoader or optimizer, whatever the user's subclass is called; a name
    with `Loader` is preferred for a DataLoader)."""
    def rank(node: ast.Call) -> tuple[int, int, int]:
        preferred = what == "DataLoader" and "Loader" in _name(node)
        return (node.end_lineno or node.lineno) - node.lineno, 0 if preferred else 1, -node.col_offset

    fitting = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
        and (_name(node) == "zero_grad" if what == "zero_grad" else _name(node)[:1].isupper())
    ]
    return min(fitting, key=rank, default=None)


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _with_keywords(source: str, call: ast.Call, wanted: Mapping[str, object]) -> str:
    """The call with `wanted` keywords set (an exclusive one's partner dropped), on one line; the user's
    own arguments kept as written."""
    def text(node: ast.AST) -> str:
        return ast.get_source_segment(source, node) or ast.unparse(node)

    dropped = {_EXCLUSIVE[k] for k, v in wanted.items() if k in _EXCLUSIVE and v is True}
    kept = [k for k in call.keywords if k.arg not in wanted and k.arg not in dropped]
    arguments = [" ".join(text(a).split()) for a in [*call.args, *kept]]
    arguments += [f"{k}={v!r}" for k, v in wanted.items()]
    return f"{text(call.func)}({', '.join(arguments)})"
