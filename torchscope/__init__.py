"""torchscope: profile a PyTorch training run and explain why it is slow.

Public API:
    profile(...)        context manager that captures a run directory (needs torch)
    Profiler            the class `profile()` makes
    load(path)          read traces into columnar tables, grouped by worker (no torch needed)
    analyze(path)       load + analyse + diagnose -> Report
    Report              the typed report (torchscope.report.model), the input of every renderer
    step()              mark the end of a training step for the capture that records, if any (no torch)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "profile", "Profiler", "load", "analyze", "Report", "step"]

# The names below are imported on first use, so `import torchscope` stays free of torch and cheap; type
# checkers see their real signatures through this block.
if TYPE_CHECKING:  # pragma: no cover
    from torchscope.capture.profiler import Profiler
    from torchscope.capture.profiler import Profiler as profile
    from torchscope.pipeline.analyze import analyze
    from torchscope.report.model import Report
    from torchscope.trace.load import load_run as load
else:

    def profile(*args: Any, **kwargs: Any) -> "Profiler":
        """Create a :class:`torchscope.capture.profiler.Profiler` (imports torch lazily)."""
        from torchscope.capture.profiler import Profiler

        return Profiler(*args, **kwargs)


def step() -> None:
    """Mark the end of a training step: under ``torchscope run`` (or inside ``torchscope.profile()``) the
    calls are the steps and automatic detection stops; with nothing recording it does nothing.
    """
    from torchscope.capture.steps import mark_step

    mark_step()


_LAZY = {
    "Profiler": ("torchscope.capture.profiler", "Profiler"),
    "load": ("torchscope.trace.load", "load_run"),
    "analyze": ("torchscope.pipeline.analyze", "analyze"),
    "Report": ("torchscope.report.model", "Report"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'torchscope' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(module), attribute)
