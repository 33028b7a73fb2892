"""Apply a finding's fixes to an unmodified script, for `torchscope tune`'s trials.

Each fix is data (`report.model.Fix`); this module turns the kinds that can be applied from outside the
code into patches installed before the script runs and removed after:

* `dataloader_kwarg` (num_workers, pin_memory, persistent_workers, prefetch_factor): the keyword is
  forced in every `torch.utils.data.DataLoader(...)` call; keywords that need workers are dropped when
  the loader has none (DataLoader would reject them), `pin_memory` when there is no accelerator.
* `optimizer_kwarg` (foreach, fused): forced in the constructor of every `torch.optim` optimizer that
  takes that keyword.
* `torch_flag`: `torch.set_num_threads` (value: threads; the script's own calls of it are then ignored and
  their sites recorded), or an attribute path under `torch` (`torch.backends.cudnn.benchmark = True`).
* `code_change` `torch.autocast` (value: the dtype, e.g. `bfloat16`, or the call the diagnosis suggests):
  every outermost `nn.Module` call (the model's forward, where the user's code calls it) runs under
  `torch.autocast` on the accelerator if there is one, else the CPU; backward and a loss computed outside
  the model stay as they were (the AMP recipe). fp16 without a GradScaler can underflow: the trial's
  loss check is what catches it.
* `code_change` `channels_last`: each outermost `nn.Module` called is converted once
  (`module.to(memory_format=torch.channels_last)`: its parameters keep their identity, so the optimizer
  still holds them) and its 4-D tensor arguments are passed in channels_last.
* `code_change` `torch.compile` (value e.g. `model = torch.compile(model)`): each outermost `nn.Module`
  with parameters called is compiled once (`torch.compile(module)`, default mode) and called through the compiled module;
  the wall time of each such call is kept (`forward_s`) so the trial can tell its compile time
  (`compile_seconds`) from the steady-state steps.
* `code_change` `optimizer.zero_grad` (value `optimizer.zero_grad(set_to_none=True)`): every
  `Optimizer.zero_grad` call sets the gradients to None.

`_APPLIERS` maps each kind to its patches, in the order they go on; the wrappers of torch's classes go
through `capture/patching.py`, so they come off exactly, in any order. Anything else is reported as not
applicable (`applicable()`), never guessed. Every patch records where
the user's code reached it (`sites`: file:line of the call, outside torch), so a trial can tell a fix
that was applied from one that never met a DataLoader or optimizer, and `tune` can point at the line
to change.
"""

from __future__ import annotations

import functools
import inspect
import os
import statistics
import sys
import time
import threading
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, ContextManager, Iterator, Optional, Sequence

from torchscope.capture.patching import Patch
from torchscope.report.model import Fix

DATALOADER_KEYWORDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
_NEEDS_WORKERS = ("persistent_workers", "prefetch_factor")
OPTIMIZER_KEYWORDS = ("foreach", "fused")
ZERO_GRAD_FIX = "optimizer.zero_grad(set_to_none=True)"
ZERO_GRAD_TARGETS = ("optimizer.zero_grad", ZERO_GRAD_FIX)

# fix label (`label(fix)`) -> the call sites ("file:line") where the patch changed a call.
sites: dict[str, set[str]] = defaultdict(set)


def label(fix: Fix) -> str:
    """The key of a fix in `sites`: kind and target."""
    return f"{fix.kind}:{fix.target}"


AUTOCAST_TARGET = "torch.autocast"
CHANNELS_LAST_TARGET = "channels_last"
COMPILE_TARGET = "torch.compile"
COMPILE_FIX = "model = torch.compile(model)"

# Wall time (s) of each outermost compiled module call, in order (the `torch.compile` patch): the first
# includes compiling the forward.
forward_s: list[float] = []


def is_compile(fix: Fix) -> bool:
    """The torch.compile code change (the model compiled where the user's code calls it)."""
    return fix.kind == "code_change" and fix.target == COMPILE_TARGET


def compile_seconds(forward: Sequence[float], backward: Sequence[float]) -> Optional[float]:
    """Compile time: the excess of the first compiled forward and the first backward over the median of
    the later ones (torch compiles the forward on the first call and the backward on the first backward;
    a recompilation later, e.g. for a new input shape, is not counted). None: fewer than two calls."""
    if len(forward) < 2:
        return None
    total = max(0.0, forward[0] - statistics.median(forward[1:]))
    if len(backward) >= 2:
        total += max(0.0, backward[0] - statistics.median(backward[1:]))
    return total


def is_autocast(fix: Fix) -> bool:
    """The autocast code change (the model's forward under torch.autocast)."""
    return fix.kind == "code_change" and fix.target == AUTOCAST_TARGET


def autocast_dtype(fix: Fix) -> str:
    """`float16` where the fix's value names it (and not bfloat16), else `bfloat16`."""
    text = str(fix.value or "")
    return "float16" if "float16" in text.replace("bfloat16", "") else "bfloat16"


_CUDA_FLAGS = ("torch.backends.cudnn.", "torch.backends.cuda.", "torch.cuda.")


def needs_cuda(fix: Fix) -> bool:
    """Fixes that change nothing without a CUDA device: `pin_memory`, and the cuDNN/CUDA flags
    (`torch.backends.cudnn.benchmark`, TF32 `torch.backends.cuda.matmul.allow_tf32`,
    `torch.backends.cudnn.allow_tf32`)."""
    if fix.kind == "dataloader_kwarg":
        return fix.target == "pin_memory"
    return fix.kind == "torch_flag" and fix.target.startswith(_CUDA_FLAGS)


def _is_zero_grad(fix: Fix) -> bool:
    return fix.kind == "code_change" and fix.target in ZERO_GRAD_TARGETS


def applicable(fix: Fix) -> bool:
    """Whether a trial can apply this fix without editing the user's code."""
    if _is_zero_grad(fix) or is_autocast(fix) or is_compile(fix) or (fix.kind == "code_change" and fix.target == CHANNELS_LAST_TARGET):
        return True
    if fix.value is None:
        return False
    if fix.kind == "dataloader_kwarg":
        return fix.target in DATALOADER_KEYWORDS
    if fix.kind == "optimizer_kwarg":
        return fix.target in OPTIMIZER_KEYWORDS
    if fix.kind == "torch_flag":
        # An attribute to set; a function (`torch.cuda.set_sync_debug_mode`, a diagnostic) is not a setting.
        name = fix.target.rpartition(".")[2]
        return fix.target == "torch.set_num_threads" or (
            fix.target.startswith("torch.") and "(" not in fix.target and not name.startswith("set_"))
    return False


@contextmanager
def applied(fixes: Sequence[Fix]) -> Iterator[None]:
    """Install the patches of `fixes` (each must be `applicable`), and remove them on exit."""
    import torch

    with ExitStack() as stack:
        for selects, patches in _APPLIERS:
            chosen = [fix for fix in fixes if selects(fix)]
            if chosen:
                for patch in patches(torch, chosen):
                    stack.enter_context(patch)
        yield


def _loader_patches(torch: Any, fixes: list[Fix]) -> list[ContextManager[Any]]:
    return [_patched_init(torch.utils.data.DataLoader, _loader_override({f.target: f.value for f in fixes}), "dataloader_kwarg")]


def _optimizer_patches(torch: Any, fixes: list[Fix]) -> list[ContextManager[Any]]:
    """Each `torch.optim` optimizer that takes one of the keywords, forced those it takes."""
    forced = {f.target: f.value for f in fixes}
    patches: list[ContextManager[Any]] = []
    for cls in _optimizer_classes(torch):
        accepted = {k: v for k, v in forced.items() if k in inspect.signature(cls).parameters}
        if accepted:
            patches.append(_patched_init(cls, _optimizer_override(accepted), "optimizer_kwarg"))
    return patches


def _first(make: Callable[[Any, Fix], ContextManager[Any]]) -> Callable[[Any, list[Fix]], list[ContextManager[Any]]]:
    """A code change applied once, by its first fix."""
    return lambda torch, fixes: [make(torch, fixes[0])]


def _each(make: Callable[[Any, Fix], ContextManager[Any]]) -> Callable[[Any, list[Fix]], list[ContextManager[Any]]]:
    return lambda torch, fixes: [make(torch, fix) for fix in fixes]


def _code_change(target: str) -> Callable[[Fix], bool]:
    return lambda fix: fix.kind == "code_change" and fix.target == target


def _optimizer_override(forced: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """`foreach` and `fused` are alternatives: forcing one on drops the user's other (both True is an error)."""
    def override(kwargs: dict[str, Any]) -> dict[str, Any]:
        merged = {**kwargs, **forced}
        for keyword, other in (("fused", "foreach"), ("foreach", "fused")):
            if forced.get(keyword) and other not in forced:
                merged.pop(other, None)
        return merged

    return override


def _loader_override(forced: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def override(kwargs: dict[str, Any]) -> dict[str, Any]:
        import torch

        merged = {**kwargs, **forced}
        if not merged.get("num_workers"):
            for keyword in _NEEDS_WORKERS:
                if keyword in forced:
                    merged.pop(keyword, None)
        if merged.get("pin_memory") and not torch.cuda.is_available():
            merged["pin_memory"] = False  # pinning needs an accelerator; on CPU it only costs a copy
        return merged

    return override


def _patched_init(cls: type, override: Callable[[dict[str, Any]], dict[str, Any]], kind: str) -> Patch:
    """Calls of `cls(...)` (keywords only: the fixes are keywords) see `override(kwargs)`; each keyword
    the override set or changed is recorded in `sites` under `kind:keyword`."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            changed = override(kwargs)
            site = _caller_site(cls)
            for keyword, value in changed.items():
                if keyword not in kwargs or kwargs[keyword] is not value:
                    sites[f"{kind}:{keyword}"].add(site)
            original(self, *args, **changed)

        return __init__

    return Patch(cls, "__init__", make)


_TORCHSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_site(cls: type | None = None) -> str:
    """file:line of the innermost frame outside torch and torchscope: where the user's code made the call.
    The `__init__` of a subclass of `cls` (calling `super().__init__`) is passed over to the line that
    built the object."""
    import torch

    skip = (_TORCHSCOPE_DIR, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    frame = sys._getframe(2)
    while frame is not None:
        constructor = (cls is not None and frame.f_code.co_name == "__init__"
                       and isinstance(frame.f_locals.get("self"), cls))
        if not frame.f_code.co_filename.startswith(skip) and not constructor:
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown"


def _optimizer_classes(torch: Any) -> list[type]:
    base = torch.optim.Optimizer
    return [c for c in vars(torch.optim).values() if isinstance(c, type) and issubclass(c, base) and c is not base]


def _zero_grad_to_none(torch: Any, fix: Fix) -> Patch:
    key = label(fix)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def zero_grad(self: Any, set_to_none: bool = True) -> None:
            if not set_to_none:
                sites[key].add(_caller_site())
            original(self, set_to_none=True)

        return zero_grad

    return Patch(torch.optim.Optimizer, "zero_grad", make)


def _outermost_calls(torch: Any, handle: Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any],
                     aside_while_compiling: bool = False) -> Patch:
    """`nn.Module.__call__` wrapped: the outermost module call of each thread (the model, where the user's
    code calls it) goes to `handle(original, module, args, kwargs)`; calls inside it, and transforms in a
    DataLoader worker, run as they were."""
    state = threading.local()

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            # While dynamo traces the model it traces this wrapper too: step aside first (no thread-local
            # lookups in the traced code).
            if aside_while_compiling and torch.compiler.is_compiling():
                return original(self, *args, **kwargs)
            if getattr(state, "inside", False) or torch.utils.data.get_worker_info() is not None:
                return original(self, *args, **kwargs)
            state.inside = True
            try:
                return handle(original, self, args, kwargs)
            finally:
                state.inside = False

        return __call__

    return Patch(torch.nn.Module, "__call__", make)


def _autocast_forward(torch: Any, fix: Fix) -> Patch:
    """The outermost module call of each thread runs under torch.autocast (modules it calls are inside)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, autocast_dtype(fix))
    key = label(fix)

    def handle(original: Callable[..., Any], module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sites[key].add(_caller_site())
        with torch.autocast(device, dtype=dtype):
            return original(module, *args, **kwargs)

    return _outermost_calls(torch, handle)


def _channels_last(torch: Any, fix: Fix) -> Patch:
    """Outermost module calls: the module converted to channels_last once, 4-D tensor arguments too."""
    converted: set[int] = set()
    key = label(fix)

    def layout(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 4:
            return value.contiguous(memory_format=torch.channels_last)
        return value

    def handle(original: Callable[..., Any], module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if id(module) not in converted:
            converted.add(id(module))
            if any(p.dim() == 4 for p in module.parameters()):  # a convolutional model: something to convert
                module.to(memory_format=torch.channels_last)
                sites[key].add(_caller_site())
        return original(module, *[layout(a) for a in args], **{k: layout(v) for k, v in kwargs.items()})

    return _outermost_calls(torch, handle)


def _compiled_forward(torch: Any, fix: Fix) -> Patch:
    """Outermost module calls go through `torch.compile(module)`, made once per module; each call timed."""
    compiled: dict[int, Any] = {}
    key = label(fix)

    def handle(original: Callable[..., Any], module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if id(module) not in compiled:
            # The model (parameters to train), not a parameterless loss module called beside it.
            compiled[id(module)] = _compile(torch, module) if any(True for _ in module.parameters()) else None
            if compiled[id(module)] is not None:
                sites[key].add(_caller_site())
        if compiled[id(module)] is None:
            return original(module, *args, **kwargs)
        began = time.perf_counter()
        try:
            return compiled[id(module)](*args, **kwargs)
        finally:
            if len(forward_s) < 10_000:  # a long script must not grow it without bound
                forward_s.append(time.perf_counter() - began)

    return _outermost_calls(torch, handle, aside_while_compiling=True)


_FORWARD_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called",
                  "_global_forward_hooks_with_kwargs")


def _compile(torch: Any, module: Any) -> Any:
    """`torch.compile(module)`, whose compiled region runs without the global module hooks (the capture's
    phase hooks): they fire on the compiled module's own call, outside the region, and inside it dynamo
    would trace them, and break the graph at each module for what they do (thread ids)."""
    optimized = torch.compile(module)
    region = getattr(optimized, "forward", None)
    if not callable(region):
        return optimized
    hooks = torch.nn.modules.module

    @functools.wraps(region)
    def forward(*args: Any, **kwargs: Any) -> Any:
        saved = {name: getattr(hooks, name) for name in _FORWARD_HOOKS if hasattr(hooks, name)}
        for name, value in saved.items():
            setattr(hooks, name, type(value)())
        try:
            return region(*args, **kwargs)
        finally:
            for name, value in saved.items():
                setattr(hooks, name, value)

    optimized.forward = forward
    return optimized


@contextmanager
def _torch_flag(torch: Any, fix: Fix) -> Iterator[None]:
    sites[label(fix)].add("process-wide")
    if fix.target == "torch.set_num_threads":
        before = torch.get_num_threads()
        torch.set_num_threads(int(fix.value))  # type: ignore[arg-type]
        try:
            with _threads_kept(torch, fix):
                yield
        finally:
            torch.set_num_threads(before)
        return
    *path, attribute = fix.target.split(".")[1:]
    owner = functools.reduce(getattr, path, torch)
    before = getattr(owner, attribute)
    setattr(owner, attribute, fix.value)
    try:
        yield
    finally:
        setattr(owner, attribute, before)


def _threads_kept(torch: Any, fix: Fix) -> Patch:
    """The script's own `torch.set_num_threads(n)` calls leave the trial's thread count as it is (a script
    that sets its threads would otherwise undo the fix before its first step, and the trial would measure
    the other fixes alone); each such call's site is recorded, so `tune` shows the line to change. torch's
    own calls pass (a DataLoader worker sets 1 thread), and so does every call in another process."""
    owner = os.getpid()
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def set_num_threads(*args: Any, **kwargs: Any) -> None:
            if os.getpid() != owner or sys._getframe(1).f_code.co_filename.startswith(torch_dir):
                return original(*args, **kwargs)
            sites[label(fix)].add(_caller_site())
            return None

        return set_num_threads

    return Patch(torch, "set_num_threads", make)


# Fix kind -> how `applied` installs it, in this order: torch.compile after the other module-call patches
# (outermost, so they run inside the compiled call); flags are process-wide settings.
_APPLIERS: tuple[tuple[Callable[[Fix], bool], Callable[[Any, list[Fix]], list[ContextManager[Any]]]], ...] = (
    (lambda fix: fix.kind == "dataloader_kwarg", _loader_patches),
    (lambda fix: fix.kind == "optimizer_kwarg", _optimizer_patches),
    (_is_zero_grad, _first(_zero_grad_to_none)),
    (is_autocast, _first(_autocast_forward)),
    (_code_change(CHANNELS_LAST_TARGET), _first(_channels_last)),
    (is_compile, _first(_compiled_forward)),
    (lambda fix: fix.kind == "torch_flag", _each(_torch_flag)),
)
