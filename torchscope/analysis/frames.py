"""Python frame and built-in names as a person writes them.

The profiler names Python events after CPython's repr: `<built-in method stack of type object at
0x7f5a36ecea40>` (a torch function: torch's functions are methods of the `torch._C._VariableFunctions`
type), `<built-in method add_ of Tensor object at 0x...>`, `<built-in function len>`, and frames as
`path/to/train.py(42): train_step`. Reports show `torch.stack`, `Tensor.add_`, `len` and
`train_step (train.py:42)`: no addresses (they differ from run to run, so the same call would never
merge), no directories."""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

from torchscope.files import read_regular

_BUILTIN_METHOD = re.compile(r"^<built-in method (?P<name>[\w.]+) of (?P<owner>[\w.]+) object at 0x[0-9a-fA-F]+>$")
_BUILTIN_FUNCTION = re.compile(r"^<built-in function (?P<name>[\w.]+)>$")
FRAME_PATTERN = re.compile(r"^(?P<file>[^()]*?)\((?P<line>\d+)\): (?P<func>.+)$")  # a Python frame: `file(line): func`
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Code that is not the user's: libraries, the interpreter's own modules, torch, and torchscope's capture
# hooks (which wrap backward, DataLoader.__next__ and optimizer.step). Paths come absolute (older PyTorch,
# files off sys.path) or relative to a sys.path entry (`torch/nn/modules/module.py`: PyTorch's tracer cuts
# the longest sys.path prefix off, see torch/profiler/python_tracer.py), hence `(^|/)`. `<frozen runpy>`,
# `<string>`, built-ins and C++ `??` are never the user's. torchscope's bundled examples stay user code:
# they are what the demo diagnoses.
_TORCH_OR_INTERPRETER = r"(^|/)torch/|(^|/)torchscope/(capture|integrations)/|^<|<built-in|^\?\?$"
_NOT_USER_CODE = re.compile(rf"(site-packages|dist-packages|/lib/python\d|/runpy\.py|/threading\.py|{_TORCH_OR_INTERPRETER})")
# The part of `_NOT_USER_CODE` that is never a user's class either: the interpreter, the standard library,
# torch and torchscope's hooks, but not a third-party package (torchvision's datasets are datasets).
_INTERPRETER_OR_TORCH = re.compile(rf"(/lib/python\d[.\d]*/(?!site-packages|dist-packages)|{_TORCH_OR_INTERPRETER})")
_ABSOLUTE = re.compile(r"^(/|[A-Za-z]:/)")
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", re.MULTILINE)
# Code names every sizeable module has; `<module>` is left out: a bare `<module>` frame is the user's script.
_GENERIC_CODE_NAMES = frozenset({"<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"})
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", ()))
# Source files read to tell library code from the user's: generous for generated modules (the largest
# installed .py files are a few MB), small enough that a trace naming a huge file cannot exhaust memory.
MAX_LIBRARY_SOURCE_BYTES = 16 << 20
# Owners whose methods users call as functions of a module (torch.stack, not type.stack).
_OWNER_PREFIX = {"type": "torch.", "PyCapsule": "", "module": "", "builtin_function_or_method": ""}
_TENSOR_OWNERS = ("Tensor", "TensorBase", "_TensorBase")
MODULE_CALL_PREFIX = "nn.Module: "


def is_library_code(name: str) -> bool:
    """Whether a frame name (`path/file.py(42): func`), a `Call stack` entry or a file path is not the
    user's own code: a library, torch, torchscope's hooks or the standard library."""
    name = name.strip()
    return _is_library(name, FRAME_PATTERN.match(name))


def is_interpreter_or_torch_code(name: str) -> bool:
    """Whether a frame name (`path/file.py(42): func`) is the interpreter's (frozen modules, built-ins), the
    standard library's, torch's or torchscope's hooks': code no user class lives in. Unlike
    `is_library_code`, an installed third-party package is not (a torchvision dataset is a dataset)."""
    name = name.strip()
    if _INTERPRETER_OR_TORCH.search(name) is not None:
        return True
    match = FRAME_PATTERN.match(name)
    file = (match["file"] if match else name).replace("\\", "/")
    if _ABSOLUTE.match(file):
        return file.startswith(_stdlib_dirs()) and not file.startswith(_site_prefixes())
    return _is_stdlib_relative(file, match["func"] if match else None)


# Training frameworks whose loop runs the user's steps, by import name: their own per-step work (hooks,
# logging, progress bars, bookkeeping) is a fixed cost per step the user tunes through the framework.
TRAINING_FRAMEWORKS = frozenset({
    "lightning", "pytorch_lightning", "lightning_fabric", "transformers", "accelerate", "trl", "ignite",
    "composer", "mmengine", "fairseq", "deepspeed",
})  # fmt: skip
_INSTALLED_PART = re.compile(r"(?:^|/)(?:site-packages|dist-packages)/(?P<top>[A-Za-z_]\w*)")
# Folders only the frameworks themselves have: a relative path (PyTorch's tracer cuts the sys.path entry off,
# the user's own too) is a framework's by these, or when this interpreter has that very file installed.
_FRAMEWORK_PART = re.compile(
    r"^(lightning/(pytorch|fabric)/|pytorch_lightning/|lightning_fabric/|transformers/(trainer|integrations|utils)|"
    r"accelerate/(accelerator|utils|data_loader|optimizer)|trl/trainer/|ignite/(engine|handlers)/|composer/trainer/|"
    r"mmengine/(runner|hooks)/|fairseq/(trainer|tasks)|deepspeed/runtime/)"
)


def training_framework(name: str) -> str | None:
    """The training framework (import name) a Python frame (`path/file.py(42): func`) belongs to, from its
    path: under a site-packages folder, or relative as PyTorch's tracer writes installed files
    (`lightning/pytorch/trainer/call.py`) in one of the framework's own folders or installed here (a user's
    `composer/metrics.py` beside their script is theirs); None for any other frame."""
    match = FRAME_PATTERN.match(name.strip())
    if match is None:
        return None
    file = match["file"].replace("\\", "/")
    installed = _INSTALLED_PART.search(file)
    if installed:
        top = installed["top"]
    elif _ABSOLUTE.match(file):
        return None
    else:
        top = file.partition("/")[0]
        if top in TRAINING_FRAMEWORKS and _FRAMEWORK_PART.match(file) is None and not is_library_code(name):
            return None
    return top if top in TRAINING_FRAMEWORKS else None


# torchscope's own code by its package's parts (`torchscope/capture/`, `torchscope/__init__.py`, ...), not any
# folder named torchscope: a user's project may be one. Its examples are training scripts, the user's kind.
_PACKAGE = Path(__file__).resolve().parents[1]
_OWN_PARTS = sorted(
    re.escape(p.name + ("/" if p.is_dir() else ""))
    for p in _PACKAGE.iterdir()
    if p.name != "examples" and not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".py")
) + [r"__init__\.py", r"__main__\.py"]
_OWN_FRAME = re.compile(rf"(^|/)torchscope/({'|'.join(_OWN_PARTS)})")


def is_measurement_frame(name: str) -> bool:
    """Frames of the profiler and torchscope's own hooks: measurement overhead, not the user's work. PyTorch's
    tracer writes a path relative to its sys.path entry (`torchscope/capture/profiler.py(232): step` where the
    package is imported from a checkout) or absolute."""
    return "torch/autograd/profiler" in name or "torch/profiler/" in name or _OWN_FRAME.search(name) is not None


def is_module_call(name: str) -> bool:
    """A Python-function event that is a call of an `nn.Module` (`nn.Module: Linear_0`); a named function,
    so that `EventTable.name_mask` keeps its answers per string for every analysis that asks."""
    return name.startswith(MODULE_CALL_PREFIX)


def is_user_frame(name: str) -> bool:
    """A Python-function event of the user's own code: `path/train.py(42): train_step` outside libraries,
    torch, the standard library and torchscope's hooks."""
    match = FRAME_PATTERN.match(name)
    return match is not None and not _is_library(name, match)


def _is_library(name: str, match: re.Match[str] | None) -> bool:
    if _NOT_USER_CODE.search(name) is not None:
        return True
    file = (match["file"] if match else name).replace("\\", "/")
    if _ABSOLUTE.match(file):
        return file.startswith(_install_dirs())
    func = match["func"] if match else None
    return _is_stdlib_relative(file, func) or _is_installed_relative(file, func)


@functools.cache
def _install_dirs() -> tuple[str, ...]:
    """This interpreter's standard-library and site-packages folders, as prefixes: absolute frames of a
    trace captured here that the layout patterns miss (`lib64`, Windows `Lib`)."""
    return tuple(sorted({*_stdlib_dirs(), *_site_prefixes()}))


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    """This interpreter's standard-library folders, as prefixes (site-packages lies inside one of them on
    most layouts: `_site_prefixes` tells it apart)."""
    paths = _scheme_paths()
    return tuple(sorted({_as_prefix(paths[key]) for key in ("stdlib", "platstdlib") if paths.get(key)}))


@functools.cache
def _site_prefixes() -> tuple[str, ...]:
    return tuple(_as_prefix(d) for d in _site_dirs())


def _as_prefix(directory: str) -> str:
    """`directory` absolute, `/`-separated, with a trailing `/`: a prefix for `str.startswith`."""
    return os.path.abspath(directory).replace("\\", "/").rstrip("/") + "/"


@functools.cache
def _scheme_paths() -> dict[str, str]:
    """This interpreter's sysconfig paths, read once (sysconfig parses the build's configuration on first
    use); imported here because most analyses of a trace never ask."""
    import sysconfig

    return sysconfig.get_paths()


def _is_stdlib_relative(file: str, func: str | None) -> bool:
    """Whether a relative frame file is the standard library's. PyTorch's tracer writes both a standard
    module (`contextlib.py`, `json/decoder.py`: relative to the stdlib's sys.path entry) and a script next
    to the user's entry point (`trace.py`: relative to the script's folder) with no folder, so a file named
    like a standard module is the standard library's only when this interpreter's copy of that module
    defines the frame's function (a user's `trace.py(3): train_step` stays theirs). With no function (a
    bare path), or no source to read, the module name decides."""
    top = file.partition("/")[0].removesuffix(".py")
    if top not in _STDLIB_NAMES:
        return False
    if func is None:
        return True
    defined = _stdlib_functions(file)
    return defined is None or func in defined or func in _GENERIC_CODE_NAMES


def _is_installed_relative(file: str, func: str | None) -> bool:
    """Whether a relative frame file is an installed package's: PyTorch's tracer cuts the site-packages
    entry off too (`transformers/models/bert/modeling_bert.py`, `numpy/core/numeric.py`), so a file that
    this interpreter's site-packages holds at that path is a library's (a user's `utils/data.py` stays
    theirs even where a package put a `utils` folder there, unless it has that very file). A bare file (`six.py`) is a
    library's only when the installed module of that name defines the frame's function: a user's
    `utils.py(3): load` next to their script stays theirs."""
    if climbs(file):
        return False
    top, sep, _ = file.partition("/")
    if sep:
        return top in _installed_names() and any(os.path.isfile(os.path.join(d, *file.split("/"))) for d in _site_dirs())
    if not file.endswith(".py") or file.removesuffix(".py") not in _installed_names():
        return False
    return func is None or func in (_defined_in(_site_dirs(), file) or ()) or func in _GENERIC_CODE_NAMES


@functools.cache
def _site_dirs() -> tuple[str, ...]:
    paths = _scheme_paths()
    return tuple(dict.fromkeys(paths[key] for key in ("purelib", "platlib") if paths.get(key)))


@functools.cache
def _installed_names() -> frozenset[str]:
    """Top-level packages and modules in this interpreter's site-packages (`torch`, `numpy`, `six`)."""
    names: set[str] = set()
    for directory in _site_dirs():
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        names.update(entry.removesuffix(".py") for entry in entries if entry.isidentifier() or entry.endswith(".py"))
    return frozenset(names)


@functools.cache
def _defined_in(directories: tuple[str, ...], file: str) -> frozenset[str] | None:
    """Functions and classes defined in `file` (relative) under the first of `directories` that has it;
    None when none has it."""
    if climbs(file):  # `json/../../../tmp/x.py` would read outside the folder
        return None
    for directory in directories:
        try:
            # The guarded opener: the path comes from a trace, and a FIFO or /dev/zero there must not block.
            text = read_regular(Path(directory, *file.split("/")), MAX_LIBRARY_SOURCE_BYTES)
        except (OSError, ValueError):  # ValueError: a NUL byte in the name
            continue
        return frozenset(_DEF.findall(text.decode("utf-8", errors="replace")))
    return None


def climbs(file: str) -> bool:
    """Whether a relative frame path has a `..` part: PyTorch's tracer never writes one (it cuts a sys.path
    prefix off a real path), so such a path is crafted and may lead out of the folder it is looked up in."""
    return ".." in file.replace("\\", "/").split("/")


@functools.cache
def _stdlib_functions(file: str) -> frozenset[str] | None:
    """Names of the functions and classes defined in the standard library's `file` (relative): empty when
    this interpreter's standard library has no such source (a C module such as `math`: a frame in a
    `math.py` is the user's), None when it ships no sources at all (then the module name decides)."""
    stdlib = _scheme_paths()["stdlib"]
    defined = _defined_in((stdlib,), file)
    if defined is not None:
        return defined
    return frozenset() if os.path.isfile(os.path.join(stdlib, "os.py")) else None


def readable(name: str) -> str:
    """`name` as a person would write it (unchanged when it is not a Python frame or built-in)."""
    if match := _BUILTIN_METHOD.match(name):
        owner, method = match["owner"], match["name"]
        if owner in _TENSOR_OWNERS:
            return f"Tensor.{method}"
        if owner.startswith("pybind11_builtins."):
            # A method bound through pybind11 (c10d's `Work.wait`, ...): its owner is pybind's internal record
            # type (`pybind11_detail_function_record_v1_system_libstdcpp_...`), which names nothing.
            return f"{method} (C++ binding)"
        return _OWNER_PREFIX.get(owner, f"{owner}.") + method
    if match := _BUILTIN_FUNCTION.match(name):
        return match["name"]
    if match := FRAME_PATTERN.match(name):
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
