"""Step detection for unmodified scripts: decide when to call ``prof.step()``.

Pure logic, fed by :class:`torchscope.capture.phases.PhaseHooks` events, so it can be tested without torch.

* **Marker**: once the script calls :func:`torchscope.step` (:func:`mark_step`), its calls are the steps and
  nothing is detected any more.
* **Optimizer** (preferred): a training step ends when the first optimizer that ever steps (the *step
  source*) finishes ``step()``. Other optimizers (GANs, several parameter groups) do not count, so steps
  are never doubled.
* **DataLoader** (fallback, while no optimizer has stepped): a step starts at every DataLoader fetch after
  the first one (inference loops, custom update rules).
* **Backward** (no optimizer object, no DataLoader: manual SGD such as ``p.data.add_(p.grad, alpha=-lr)``):
  a step starts at the first top-level forward after a ``backward()``.
* **Module** (no backward either, e.g. a loop that only evaluates): a step starts at every call of the
  first top-level module the script called, after its first call (the loop's repeating pattern).

Whichever fallback marks a step first keeps marking them, until an optimizer steps (which then takes over).
While an optimizer exists that has not stepped yet, the fallbacks hold their steps: under gradient
accumulation the first micro-batches come before the first optimizer step, and marking them as steps put
single micro-batches and the first optimizer step (which creates its state) into the recorded window.
DataLoader and backward boundaries are held :data:`MAX_HELD` times at most (an evaluation script that
builds an optimizer it never steps still gets its steps); repeated model calls without a fetch or a
backward between them, as long as it takes: a reinforcement-learning rollout calls its policy hundreds of
times before the first update, and each call became a step of the recorded window. A script that builds an
optimizer and then only calls a model, with no DataLoader, is left without steps (the capture says so).

The optimizer boundary is *deferred*: ``prof.step()`` runs at the next top-level event (a DataLoader fetch,
a forward or a backward starting) with autograd on, instead of inside the optimizer hook. The hook runs inside torch's own
``Optimizer.step#...`` range, and closing ``ProfilerStep#N`` there would leave that range straddling two
steps; deferred, every range nests inside one ``ProfilerStep``. Work between the optimizer step and the
next event (logging, a checkpoint, an evaluation under ``torch.no_grad()`` with its own fetches and
forwards) stays in the step that it follows. The only exception: the step
source stepping twice with nothing in between (e.g. LBFGS with a closure: the forward and backward inside
the closure are not top-level events) steps inside the hook.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from torchscope.rundir.manifest import StepMarking

_FALLBACKS = ("none", "dataloader", "backward", "module")
# DataLoader or backward boundaries held while an optimizer exists but has not stepped: accumulation over up
# to 32 micro-batches; an optimizer that never steps (an evaluation script that builds one) delays the
# fallback steps by this many boundaries. Module boundaries (a rollout) are held without a limit.
MAX_HELD = 32


class StepDetector:
    """Turns phase events into ``step()`` calls; ``source`` says what drove them (the manifest's
    ``options.step_marking``)."""

    def __init__(self, step: Callable[[], None], optimizer_created: Callable[[], bool] = lambda: False) -> None:
        self._step = step
        self._optimizer_created = optimizer_created  # whether the script has built an optimizer yet
        self.held = 0  # fallback boundaries held for an optimizer that had not stepped
        self._source_ref: Callable[[], Any] | None = None  # weak reference to the step-source optimizer
        self._pending = False
        self._fetches = 0
        self._anchor = 0  # id() of the first top-level module called: the loop's repeating pattern
        self._anchor_since_step = False
        self._backward_since_step = False
        self.source: StepMarking = "none"

    def on_boundary(self, kind: str, key: int = 0, grad_enabled: bool = True) -> None:
        """A top-level fetch (``"data"``), forward (``key``: the module's id) or backward is about to start
        (``grad_enabled``: with autograd recording, as ``torch.is_grad_enabled()`` says)."""
        if self._pending and not grad_enabled and self.source == "optimizer":
            return  # an evaluation after the optimizer step (no_grad/inference_mode): it stays in that step
        if self._pending:
            self._pending = False
            self._mark()
            return
        if self.source == "manual" or self._source_optimizer() is not None:
            return
        if kind == "data":
            if self._fetches > 0 and self.source in ("none", "dataloader"):
                self._mark("dataloader")
            self._fetches += 1
        elif kind == "backward":
            self._backward_since_step = True
        elif kind == "forward":
            self._on_forward(key)

    def _on_forward(self, key: int) -> None:
        if self._anchor == 0:
            self._anchor = key
        if self._backward_since_step and self.source in ("none", "backward", "module"):
            self._mark("backward")
        elif key == self._anchor and self._anchor_since_step and self.source in ("none", "module"):
            self._mark("module")
        if key == self._anchor:
            self._anchor_since_step = True

    def _mark(self, source: StepMarking | None = None) -> None:
        if source is not None:
            self.source = source
        self._backward_since_step = False
        self._anchor_since_step = False
        if source is not None and (self.held < MAX_HELD or source == "module") and self._optimizer_created():
            self.held += 1  # a fallback's boundary: the optimizer's first step will mark the steps
            return
        self._step()

    def on_optimizer_step(self, optimizer: Any) -> None:
        """An optimizer finished ``step()`` (outside any other phase)."""
        if self.source == "manual":
            return
        source = self._source_optimizer()
        if source is None:
            source = optimizer
            self._source_ref = _reference(optimizer)
            self.source = "optimizer"
        if optimizer is not source:
            return
        if self._pending:  # stepped twice with nothing in between: no later event to defer to
            self._step()
        self._pending = True

    def on_marker(self) -> None:
        """The script called :func:`torchscope.step`: from now on its calls are the steps."""
        self.source = "manual"
        self._pending = False
        self._step()

    def _source_optimizer(self) -> Any:
        # A step source that was garbage collected (a second training phase) hands over to the next.
        return self._source_ref() if self._source_ref is not None else None


def _reference(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep it alive instead
        return lambda: obj


# -- torchscope.step(): the explicit marker ----------------------------------------------------------------

_markers: list[Callable[[], None]] = []  # the recording captures' step functions, most recent last


def register_marker(step: Callable[[], None]) -> None:
    """Let :func:`mark_step` reach a capture while it records (``Profiler.start``)."""
    if step not in _markers:
        _markers.append(step)


def unregister_marker(step: Callable[[], None]) -> None:
    if step in _markers:
        _markers.remove(step)


def mark_step() -> None:
    """One training step ended (``torchscope.step()``): tells the capture that is recording, if any.

    A no-op when nothing records, so a script can keep the call and still run under plain ``python``."""
    if _markers:
        _markers[-1]()
