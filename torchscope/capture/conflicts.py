"""Stepping aside when the profiled program starts a profiler of its own.

Only one Kineto session can run in a process: a script that starts its own ``torch.profiler.profile``
(or ``torchscope.profile()``) while ``torchscope run`` records crashes (a segfault) or records nothing.
Every torch profiler prepares its session through ``torch.autograd.profiler.profile._prepare_trace``;
while a torchscope profiler is active that method is wrapped, and a call that does not come from that
torchscope profiler makes it stop first (:meth:`Profiler.step_aside`), so the program's own profiler gets
the session and works as it does under plain python.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol


class Yielding(Protocol):
    """A torchscope profiler that can stop for the program's own."""

    def step_aside(self) -> None: ...


_active: list[Yielding] = []
_local = threading.local()  # .owner: the torchscope profiler whose own call into torch is under way
_original: Callable[..., Any] | None = None


def _prepare_target() -> Any:
    import torch.autograd.profiler

    return torch.autograd.profiler.profile


def _guarded_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
    original = _original or _prepare_target()._prepare_trace  # stepping aside may unwrap it
    owner = getattr(_local, "owner", None)
    for profiler in [p for p in _active if p is not owner]:
        profiler.step_aside()  # before the other session starts: two at once crash Kineto
    return original(self, *args, **kwargs)


def activate(profiler: Yielding) -> None:
    """Watch for other profilers while `profiler` records (installs the wrapper once)."""
    global _original
    target = _prepare_target()
    if _original is None:
        _original = target._prepare_trace
        target._prepare_trace = _guarded_prepare
    if profiler not in _active:
        _active.append(profiler)


def deactivate(profiler: Yielding) -> None:
    """Stop watching for `profiler`; the wrapper goes when no torchscope profiler is active."""
    global _original
    if profiler in _active:
        _active.remove(profiler)
    if not _active and _original is not None:
        _prepare_target()._prepare_trace = _original
        _original = None


@contextmanager
def own_call(profiler: Yielding) -> Iterator[None]:
    """Mark the calls into torch made inside this block as `profiler`'s own."""
    previous = getattr(_local, "owner", None)
    _local.owner = profiler
    try:
        yield
    finally:
        _local.owner = previous
