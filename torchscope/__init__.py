"""torchscope: profile a PyTorch training run and explain why it is slow.

Public API:
    profile(...)        context manager that captures a run directory (needs torch)
    load(path)          read traces into columnar TraceTables (no torch needed)
    analyze(path)       load + analyse + diagnose -> Report
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "profile", "Profiler", "load", "analyze"]

if TYPE_CHECKING:  # pragma: no cover
    from torchscope.capture.profiler import Profiler


def profile(*args: Any, **kwargs: Any) -> "Profiler":
    """Create a :class:`torchscope.capture.profiler.Profiler` (imports torch lazily)."""
    from torchscope.capture.profiler import Profiler

    return Profiler(*args, **kwargs)


def __getattr__(name: str) -> Any:
    # Lazy imports keep `import torchscope` free of torch and cheap.
    if name == "Profiler":
        from torchscope.capture.profiler import Profiler

        return Profiler
    if name == "load":
        from torchscope.trace.load import load_run

        return load_run
    if name == "analyze":
        from torchscope.report.build import analyze

        return analyze
    raise AttributeError(f"module 'torchscope' has no attribute {name!r}")
