"""Every built-in analysis, in one list (see analysis/registry.py for the shape of one).

To add an analysis: write its extract and reduce in a module of its own, then list it here (built-in,
filling typed Report fields) or call `registry.register()` (a plug-in, filling `report.extra`).
"""

from __future__ import annotations

from typing import Any, Collection

from torchscope.analysis.callsites import CALL_SITES
from torchscope.analysis.device_tables import DEVICE, KERNELS
from torchscope.analysis.distributed import DISTRIBUTED
from torchscope.analysis.memory import MEMORY
from torchscope.analysis.modules import MODULES
from torchscope.analysis.op_tables import OPERATORS, RANGES
from torchscope.analysis.getitem import GETITEM
from torchscope.analysis.overhead import OVERHEAD
from torchscope.analysis.registry import Analysis, registered
from torchscope.analysis.sections import SECTIONS
from torchscope.analysis.span_meta import META
from torchscope.analysis.step_table import STEPS
from torchscope.analysis.timeline import TIMELINE

BUILTIN: tuple[Analysis[Any], ...] = (STEPS, OPERATORS, RANGES, MODULES, CALL_SITES, KERNELS, DEVICE, MEMORY, DISTRIBUTED, *SECTIONS, OVERHEAD, GETITEM)
# Sidecars cost time and memory that a terminal or JSON report does not need: computed when asked for.
BUILTIN_SIDECARS: tuple[Analysis[Any], ...] = (TIMELINE,)


def all_analyses(sidecars: Collection[str] | None = ()) -> tuple[Analysis[Any], ...]:
    """The span metadata first (the pipeline needs it), then the built-ins, the built-in sidecars named in
    `sidecars` (None: all of them), then registered plug-ins."""
    wanted = tuple(a for a in BUILTIN_SIDECARS if sidecars is None or a.name in sidecars)
    return (META, *BUILTIN, *wanted, *registered())
