"""Global hooks that label training phases and report phase boundaries.

Labels are ``record_function`` ranges (``user_annotation`` events in the trace) with fixed names
(:mod:`torchscope.rundir.labels`, where the analyses look them up):

* ``torchscope:forward``   -- the outermost ``nn.Module`` call (global forward pre/post hooks); once a
  backward has run, not a call made without gradients (validation: see ``NO_GRAD_FORWARD``)
* ``torchscope:backward``  -- ``Tensor.backward`` / ``torch.autograd.backward``
* ``torchscope:optimizer`` -- ``Optimizer.step`` (global optimizer step pre/post hooks)
* ``torchscope:closure``   -- the closure of ``optimizer.step(closure)`` (LBFGS, Lightning): the optimizer
  label is suspended while it runs, so the forward and backward inside it are labelled as such

Data loading needs no label: torch already marks each fetch as ``enumerate(DataLoader)#..._DataLoaderIter.__next__``,
and ``zero_grad`` keeps torch's own ``Optimizer.zero_grad#<Cls>.zero_grad`` range.

Only one phase is open at a time in the whole process: a module called inside backward (activation
checkpointing), inside an optimizer step (outside its closure) or on another thread while a phase is open
(``DataParallel`` replicas) is part of the open phase, so ranges always nest properly. A closure passed
to ``step()`` is wrapped (through the step pre-hook, which may replace the arguments): the optimizer
range closes when the closure starts and reopens when it returns, so ``torchscope:optimizer`` ranges
cover the optimizer's own work only.

The same hooks report *boundaries* -- a top-level DataLoader fetch, forward (with the module's id) or
backward starting, an optimizer step ending -- to the step detector (:mod:`torchscope.capture.steps`).
Boundaries inside a closure are not reported: they are inside torch's ``Optimizer.step#`` range, where a
step must not end.

The hooks never modify tensors, arguments or results, do nothing in forked DataLoader workers and
during ``torch.compile`` tracing, and swallow their own errors (recorded once through ``on_error``).
Exceptions raised *by the boundary callbacks* (``CaptureComplete``, a ``SystemExit``) do propagate: that is
how ``--stop-after-active`` ends the script.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable, Literal

import msgspec
import torch
import torch.autograd
import torch.optim.optimizer as optim_module
import torch.utils.data.dataloader as dataloader_module
from torch.nn.modules import module as nn_module

from torchscope.capture.ignored_warnings import IgnoredWarning
from torchscope.capture.notices import describe
from torchscope.rundir.labels import BACKWARD, CLOSURE, FORWARD, OPTIMIZER

Boundary = Literal["data", "forward", "backward"]

_pid = os.getpid()
# torch warns at every call of a compiled module while any global module hook exists, and ours are the
# only ones the user did not write: the extra call it warns of (the OptimizedModule's own) is the outer
# module call our forward depth already counts (tests/integration/test_capture_compiled.py).
_COMPILED_MODULE_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"
# Once the run has trained (a backward ran), an outermost module call without gradients is validation, a
# metric or an EMA/teacher model, not the training forward: tracked like a forward (nested calls, step
# boundaries) but given no label, so its time is the step's work outside the phases and names itself
# there (`nn.Module: ...`). Before any backward (an inference loop), it is the forward.
NO_GRAD_FORWARD = "forward without gradients"
_FORWARDS = (FORWARD, NO_GRAD_FORWARD)


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def optimizer_created() -> bool:
    """Whether the script has built a torch.optim optimizer: torch wraps each optimizer class's ``step``
    for its profiler on the class's first instance (``Optimizer._patch_step_function`` marks it ``hooked``).
    A walk over a few dozen classes, no scan of the heap."""
    pending: list[type] = [optim_module.Optimizer]
    while pending:
        cls = pending.pop()
        if getattr(getattr(cls, "step", None), "hooked", False):
            return True
        pending.extend(cls.__subclasses__())
    return False


class _OpenPhase(msgspec.Struct):
    name: str
    key: int  # id() of the module or optimizer that opened it (0 for backward)
    thread: int
    range: Any  # the entered record_function, or None when labels are off
    started: float = 0.0  # perf_counter when it opened, for on_phase_time


class PhaseHooks:
    """Install/uninstall the global hooks. One instance per capture; ``install`` twice is a no-op."""

    def __init__(
        self,
        *,
        labels: bool = True,
        on_boundary: Callable[[Boundary, int, bool], None] | None = None,
        on_optimizer_step: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        on_phase_time: Callable[[str, float], None] | None = None,
    ) -> None:
        self.labels = labels
        self._on_phase_time = on_phase_time  # (label, seconds) as each phase closes: the step clock's phases
        self._on_boundary = on_boundary
        self._on_optimizer_step = on_optimizer_step
        self._on_error = on_error
        self._error_reported = False
        self._owner_pid = 0
        self._active: _OpenPhase | None = None
        self._forward_depth = 0  # module calls open inside the forward phase, on its thread
        self._trained = False  # a backward ran in this process (see NO_GRAD_FORWARD)
        self._closures = 0  # optimizer-step closures running now (boundaries inside them are not reported)
        self._retire_requested = False
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, wrapper)
        self._compiled_warning = IgnoredWarning(_COMPILED_MODULE_HOOK_WARNING)

    @property
    def installed(self) -> bool:
        return bool(self._handles or self._patches)

    @property
    def active_phase(self) -> str | None:
        """Name of the phase open right now (any thread), or None."""
        return self._active.name if self._active else None

    # -- installation -------------------------------------------------------------------------------

    def install(self) -> None:
        if self.installed:
            return
        self._owner_pid = _pid
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_module.register_optimizer_step_post_hook(self._optimizer_post),
        ]
        self._compiled_warning.install()
        self._patch(torch.Tensor, "backward", self._wrap_backward)
        self._patch(torch.autograd, "backward", self._wrap_backward)
        if self._on_boundary is not None:
            self._patch(dataloader_module._BaseDataLoaderIter, "__next__", self._wrap_next)

    def uninstall(self) -> None:
        """Remove every hook and patch, closing a phase left open (e.g. by Ctrl-C inside forward)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._compiled_warning.uninstall()
        for owner, attribute, original, wrapper in reversed(self._patches):
            if getattr(owner, attribute, None) is wrapper:  # someone patched over us: leave theirs alone
                setattr(owner, attribute, original)
        self._patches = []
        if self._active is not None:
            self._close(self._active)

    def _patch(self, owner: Any, attribute: str, make_wrapper: Callable[[Any], Any]) -> None:
        original = getattr(owner, attribute)
        wrapper = make_wrapper(original)
        setattr(owner, attribute, wrapper)
        self._patches.append((owner, attribute, original, wrapper))

    # -- phase bookkeeping ------------------------------------------------------------------------

    def _ours(self) -> bool:
        return _pid == self._owner_pid and not _compiling()

    def _open(self, name: str, key: int) -> _OpenPhase:
        rf = None
        if self.labels and name is not NO_GRAD_FORWARD:
            try:
                rf = torch.autograd.profiler.record_function(name)
                rf.__enter__()
            except Exception as exc:
                rf = None
                self._report(exc)
        phase = _OpenPhase(name, key, threading.get_ident(), rf, time.perf_counter())
        self._active = phase
        return phase

    def _close(self, phase: _OpenPhase) -> None:
        if self._active is phase:
            self._active = None
        if phase.range is not None:
            try:
                phase.range.__exit__(None, None, None)
            except Exception as exc:
                self._report(exc)
        if self._on_phase_time is not None:
            self._on_phase_time(phase.name, time.perf_counter() - phase.started)

    def retire(self) -> None:
        """Uninstall at the next boundary: the capture is over, the hooks would only cost time.

        Not at once: this may be called from inside an optimizer hook, and torch iterates the live
        dict of optimizer hooks (removing one there would raise in the user's ``optimizer.step()``).
        """
        self._retire_requested = True

    def _boundary(self, kind: Boundary, key: int = 0) -> bool:
        """Report a boundary (no phase is open; ``key`` is the module's id for a forward). False when the
        hooks were retired meanwhile.

        The callback may raise CaptureComplete (a SystemExit) on purpose; that propagates."""
        if self._closures:
            return True
        if self._on_boundary is not None:
            try:
                self._on_boundary(kind, key, torch.is_grad_enabled())
            except Exception as exc:
                self._report(exc)
        if self._retire_requested:
            self.uninstall()
            return False
        return True

    def _report(self, exc: Exception) -> None:
        if self._on_error is not None and not self._error_reported:
            self._error_reported = True
            self._on_error(f"phase hook failed, labels may be incomplete: {describe(exc)}")

    # -- hooks -----------------------------------------------------------------------------------------

    # The forward hooks run for every module call: the nested-call path is kept to a few attribute loads.

    # Under torch.compile these hooks are traced: `_compiling()` must come before anything dynamo cannot
    # trace (threading.get_ident, record_function), or every module call becomes a graph break.

    def _forward_pre(self, module: Any, args: Any) -> None:
        if _compiling():
            return None
        phase = self._active
        if phase is None:
            if _pid != self._owner_pid:
                return None
            if not self._boundary("forward", id(module)):  # before the range opens: a new step starts outside it
                return None
            self._open(NO_GRAD_FORWARD if self._trained and not torch.is_grad_enabled() else FORWARD, id(module))
            self._forward_depth = 1
        elif phase.name in _FORWARDS and phase.thread == threading.get_ident():
            self._forward_depth += 1
        return None

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if _compiling():
            return None
        phase = self._active
        if phase is not None and phase.name in _FORWARDS and phase.thread == threading.get_ident():
            self._forward_depth -= 1
            if self._forward_depth <= 0:
                self._close(phase)
        return None

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if not self._ours():
            return None
        phase = self._active
        if phase is not None and phase.name == OPTIMIZER and phase.key == id(optimizer):
            self._close(phase)  # left open by an earlier step of this optimizer that raised
            phase = None
        if phase is None:
            return self._wrap_closure_argument(self._open(OPTIMIZER, id(optimizer)), args, kwargs)
        return None

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._ours():
            return None
        phase = self._active
        if phase is not None and phase.name == OPTIMIZER and phase.key == id(optimizer):
            self._close(phase)
        if self._active is None and self._on_optimizer_step is not None:
            try:
                self._on_optimizer_step(optimizer)
            except Exception as exc:
                self._report(exc)
        return None

    def _wrap_closure_argument(self, phase: _OpenPhase, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The step's arguments with its closure wrapped (``args`` holds the optimizer first), or None
        (unchanged) when it has none: torch's pre-hook protocol."""
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._closure_wrapper(phase, kwargs["closure"])}
        if len(args) >= 2 and callable(args[1]):
            return (args[0], self._closure_wrapper(phase, args[1]), *args[2:]), kwargs
        return None

    def _closure_wrapper(self, phase: _OpenPhase, closure: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(closure)
        def run_closure(*args: Any, **kwargs: Any) -> Any:
            # The step's optimizer phase open now (reopened after each earlier call: LBFGS calls it often).
            current = self._active
            suspended = current is not None and current.name is OPTIMIZER and current.key == phase.key
            if current is not None and suspended and current.thread == threading.get_ident():
                self._close(current)
            else:
                suspended = False
            self._closures += 1
            label = self._label(CLOSURE)
            try:
                return closure(*args, **kwargs)
            finally:
                self._end_label(label)
                self._closures -= 1
                if suspended and self._active is None and self.installed:
                    self._open(OPTIMIZER, phase.key)  # the step goes on after the closure

        return run_closure

    def _label(self, name: str) -> Any:
        """An entered record_function range that is not a phase (None when labels are off)."""
        if not self.labels:
            return None
        try:
            rf = torch.autograd.profiler.record_function(name)
            rf.__enter__()
            return rf
        except Exception as exc:
            self._report(exc)
            return None

    def _end_label(self, rf: Any) -> None:
        if rf is not None:
            try:
                rf.__exit__(None, None, None)
            except Exception as exc:
                self._report(exc)

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            opened = None
            if self._active is None and self._ours() and self._boundary("backward"):
                opened = self._open(BACKWARD, 0)
                self._trained = True
            try:
                return original(*args, **kwargs)
            finally:
                if opened is not None:
                    self._close(opened)

        return backward

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:
            if self._active is None and self._ours():
                self._boundary("data")  # before torch opens its enumerate(DataLoader)# range
            return original(iterator)

        return __next__
