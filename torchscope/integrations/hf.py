"""Hugging Face Transformers: ``TorchscopeCallback`` records a torchscope run directory from ``Trainer``.

    from torchscope.integrations.hf import TorchscopeCallback
    trainer = transformers.Trainer(..., callbacks=[TorchscopeCallback(out="runs")])

Recording starts at ``on_train_begin``; a step ends at every ``on_step_end`` (one per optimizer step,
after gradient accumulation). Every process records, one trace per rank, as under
``torchrun -m torchscope run``.
"""

from __future__ import annotations

import os
from typing import Any

from torchscope.integrations.session import CaptureSession, missing

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - depends on what is installed
    raise missing("transformers", "hf") from None


class TorchscopeCallback(TrainerCallback):
    """Capture the training of ``Trainer.train`` into a run directory.

    Args:
        out: as :func:`torchscope.profile`'s ``out``.
        options: :func:`torchscope.profile`'s keywords (``wait``, ``active``, ``with_stack``, ...).
    """

    def __init__(self, out: str | os.PathLike[str] = "runs", **options: Any) -> None:
        self.session = CaptureSession(out, **options)

    @property
    def run_dir(self) -> Any:
        """The run directory (a ``Path``) once recording started, else None."""
        return self.session.run_dir

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.start()
        self.session.optimizer_steps = int(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.step(int(state.global_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.finish()
