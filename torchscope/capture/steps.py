"""Step detection for unmodified scripts: decide when to call ``prof.step()``.

Pure logic, fed by :class:`torchscope.capture.phases.PhaseHooks` events, so it can be tested without torch.

* **Optimizer** (preferred): a training step ends when the first optimizer that ever steps (the *step
  source*) finishes ``step()``. Other optimizers (GANs, several parameter groups) do not count, so steps
  are never doubled.
* **DataLoader** (fallback, while no optimizer has stepped): a step starts at every DataLoader fetch after
  the first one (inference loops, custom update rules).

The optimizer boundary is *deferred*: ``prof.step()`` runs at the next top-level event (a DataLoader fetch,
a forward or a backward starting) instead of inside the optimizer hook. The hook runs inside torch's own
``Optimizer.step#...`` range, and closing ``ProfilerStep#N`` there would leave that range straddling two
steps; deferred, every range nests inside one ``ProfilerStep``. Work between the optimizer step and the
next event (logging, a checkpoint) stays in the step that it follows. The only exception: the step
source stepping twice with nothing in between (e.g. LBFGS with a closure) steps inside the hook.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from torchscope.rundir.manifest import StepMarking


class StepDetector:
    """Turns phase events into ``step()`` calls; ``source`` says what drove them (the manifest's
    ``options.step_marking``)."""

    def __init__(self, step: Callable[[], None]) -> None:
        self._step = step
        self._source_ref: Callable[[], Any] | None = None  # weak reference to the step-source optimizer
        self._pending = False
        self._fetches = 0
        self._dataloader_steps = 0
        self.source: StepMarking = "none"

    def on_boundary(self, kind: str) -> None:
        """A top-level fetch (``"data"``), forward or backward is about to start."""
        if self._pending:
            self._pending = False
            self._step()
            return
        if kind == "data" and self._source_optimizer() is None:
            if self._fetches > 0:
                self.source = "dataloader"
                self._dataloader_steps += 1
                self._step()
            self._fetches += 1

    def on_optimizer_step(self, optimizer: Any) -> None:
        """An optimizer finished ``step()`` (outside any other phase)."""
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

    def _source_optimizer(self) -> Any:
        # A step source that was garbage collected (a second training phase) hands over to the next.
        return self._source_ref() if self._source_ref is not None else None


def _reference(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep it alive instead
        return lambda: obj
