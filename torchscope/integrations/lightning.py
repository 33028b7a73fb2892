"""Lightning: ``TorchscopeCallback`` records a torchscope run directory from ``Trainer.fit``.

    from torchscope.integrations.lightning import TorchscopeCallback
    trainer = lightning.Trainer(callbacks=[TorchscopeCallback(out="runs")])

Recording starts at ``on_train_start`` and a step ends at every ``on_train_batch_end`` after which the
trainer's optimizer-step counter (``global_step``) moved on. Lightning runs forward and backward inside
``optimizer.step(closure)``; the phase hooks take the closure out of the optimizer's time (docs/capture.md).
Works with ``lightning`` and with the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import os
from typing import Any

from torchscope.integrations.session import CaptureSession, missing

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment,unused-ignore]
    except ImportError:
        raise missing("lightning", "lightning") from None


class TorchscopeCallback(Callback):
    """Capture the training of ``Trainer.fit`` into a run directory.

    Args:
        out: as :func:`torchscope.profile`'s ``out``.
        options: :func:`torchscope.profile`'s keywords (``wait``, ``active``, ``with_stack``, ...).
    """

    def __init__(self, out: str | os.PathLike[str] = "runs", **options: Any) -> None:
        super().__init__()
        self.session = CaptureSession(out, **options)

    @property
    def run_dir(self) -> Any:
        """The run directory (a ``Path``) once recording started, else None."""
        return self.session.run_dir

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start()
        self.session.optimizer_steps = int(trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.session.step(int(trainer.global_step))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(exception)
