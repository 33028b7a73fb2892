"""Every built-in analysis, in one list (see analysis/registry.py for the shape of one).

To add an analysis: write its extract and reduce in a module of its own, then list it here (built-in,
filling typed Report fields) or call `registry.register()` (a plug-in, filling `report.extra`).
"""

from __future__ import annotations

from typing import Any

from torchscope.analysis.device_tables import DEVICE, KERNELS
from torchscope.analysis.memory import MEMORY
from torchscope.analysis.op_tables import OPERATORS, RANGES
from torchscope.analysis.registry import Analysis, registered
from torchscope.analysis.sections import SECTIONS
from torchscope.analysis.span_meta import META
from torchscope.analysis.step_table import STEPS
from torchscope.analysis.timeline import TIMELINE

BUILTIN: tuple[Analysis[Any], ...] = (STEPS, OPERATORS, RANGES, KERNELS, DEVICE, MEMORY, *SECTIONS, TIMELINE)


def all_analyses() -> tuple[Analysis[Any], ...]:
    """The span metadata first (the pipeline needs it), then the built-ins, then registered plug-ins."""
    return (META, *BUILTIN, *registered())
