"""Python frame and built-in names as a person writes them.

The profiler names Python events after CPython's repr: `<built-in method stack of type object at
0x7f5a36ecea40>` (a torch function: torch's functions are methods of the `torch._C._VariableFunctions`
type), `<built-in method add_ of Tensor object at 0x...>`, `<built-in function len>`, and frames as
`path/to/train.py(42): train_step`. Reports show `torch.stack`, `Tensor.add_`, `len` and
`train_step (train.py:42)`: no addresses (they differ from run to run, so the same call would never
merge), no directories."""

from __future__ import annotations

import re

_BUILTIN_METHOD = re.compile(r"^<built-in method (?P<name>[\w.]+) of (?P<owner>[\w.]+) object at 0x[0-9a-fA-F]+>$")
_BUILTIN_FUNCTION = re.compile(r"^<built-in function (?P<name>[\w.]+)>$")
_FRAME = re.compile(r"^(?P<file>[^()]*?)\((?P<line>\d+)\): (?P<func>.+)$")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Code that is not the user's: libraries, the interpreter's own modules, torch, and torchscope's capture
# hooks (which wrap backward, DataLoader.__next__ and optimizer.step). Paths come absolute (installed or
# editable packages) or relative to a sys.path entry (`torch/nn/modules/module.py`), hence `(^|/)`.
# torchscope's bundled examples stay user code: they are what the demo diagnoses.
_NOT_USER_CODE = re.compile(
    r"(site-packages|dist-packages|/lib/python\d|(^|/)torch/|(^|/)torchscope/(capture|integrations)/|^<|<built-in"
    r"|/runpy\.py|/threading\.py|^\?\?$)"
)
# Owners whose methods users call as functions of a module (torch.stack, not type.stack).
_OWNER_PREFIX = {"type": "torch.", "PyCapsule": "", "module": "", "builtin_function_or_method": ""}
_TENSOR_OWNERS = ("Tensor", "TensorBase", "_TensorBase")


def is_library_code(name: str) -> bool:
    """Whether a frame name (`path/file.py(42): func`), a `Call stack` entry or a file path is not the
    user's own code."""
    return _NOT_USER_CODE.search(name) is not None


def is_user_frame(name: str) -> bool:
    """A Python-function event of the user's own code: `path/train.py(42): train_step` outside libraries,
    torch and torchscope's hooks."""
    return _FRAME.match(name) is not None and not is_library_code(name)


def readable(name: str) -> str:
    """`name` as a person would write it (unchanged when it is not a Python frame or built-in)."""
    if match := _BUILTIN_METHOD.match(name):
        owner, method = match["owner"], match["name"]
        if owner in _TENSOR_OWNERS:
            return f"Tensor.{method}"
        return _OWNER_PREFIX.get(owner, f"{owner}.") + method
    if match := _BUILTIN_FUNCTION.match(name):
        return match["name"]
    if match := _FRAME.match(name):
        file = match["file"].replace("\\", "/").rsplit("/", 1)[-1]
        return f"{match['func']} ({file}:{match['line']})"
    return _ADDRESS.sub("", name)


def readable_totals(totals: dict[str, float]) -> dict[str, float]:
    """`{name: value}` with readable names; values of names that read the same are added, largest first."""
    merged: dict[str, float] = {}
    for name, value in totals.items():
        key = readable(name)
        merged[key] = merged.get(key, 0.0) + value
    return dict(sorted(merged.items(), key=lambda kv: -kv[1]))
