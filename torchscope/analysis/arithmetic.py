"""Where a CPU step's arithmetic runs: what vectorising a loop, batching or compiling keeps of it
(analysis/whatif.py's `dispatch` cause and `measurements.dispatch`'s matmul figures).

* Matmul units: main-thread operators with a FLOPs figure (analysis/flops.py: matmuls, linear layers,
  convolutions, from the recorded shapes) inside no other such operator. On a CPU `aten::mm` and
  `aten::addmm` call `aten::resolve_conj` (and addmm `expand` and `copy_` for its bias), so they are no
  leaves of the call tree although their time is the GEMM's. What batching keeps of a unit is its FLOPs at
  the machine's matmul rate, never more than its recorded time: a per-sample matrix-vector product runs
  far below that rate (its recorded time is mostly its fixed cost and a pass over the weights), the
  batched product near it. The rate is that of the trace's own large units (`LARGE_MATMUL_FLOPS`), which
  ran on the capture's threads under the profiler as the units did; without one, for matrix multiplies
  the matmul rate measured at capture end (manifest `cpu_peak`, applied by the rule); otherwise the trace
  cannot tell, and the kept time spans all of the units' time (low) to none of it (high). Convolutions get
  no rate from a matmul: oneDNN's kernels on few channels run far below a GEMM's rate (a per-sample
  3-16-channel convnet's convolutions ran at 17-25 GFLOP/s where a 512 x 512 matmul ran at 358).
* Other leaves: main-thread operators that call no other operator and lie in no unit (elementwise ops,
  reductions, ...): batching keeps their time (low) .. the time of those of at least `TINY_OP_US` (high).
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.flops import MATMUL_OPS, event_flops
from torchscope.analysis.nesting import HostTree, operator_parent
from torchscope.analysis.operators import OpTimes
from torchscope.analysis.steps import main_thread_mask
from torchscope.trace.tables import EventTable

# A unit doing this much work runs near the machine's matmul rate: its fixed cost (tens of us under the
# profiler) is a tenth or less of it (2**24 FLOPs at 50 GFLOP/s: 340 us).
LARGE_MATMUL_FLOPS = float(2**24)


class Arithmetic(msgspec.Struct, frozen=True):
    """Main-thread operator rows where the arithmetic runs (ascending event indices)."""

    units: np.ndarray  # matmul units
    unit_flops: np.ndarray  # FLOPs of each unit
    leaves: np.ndarray  # leaves outside any unit

    def units_within(self, events: EventTable, within: intervals.IntervalSet, which: np.ndarray | None = None) -> tuple[float, float]:
        """The units' (or those of the mask `which`) time inside `within` (us) and their FLOPs there
        (GFLOP; a unit partly inside counts in proportion)."""
        units, flops = (self.units, self.unit_flops) if which is None else (self.units[which], self.unit_flops[which])
        start, duration = events.ts_us[units], events.dur_us[units]
        inside = intervals.overlap_per_window(within, start, start + duration)
        share = np.divide(inside, duration, out=np.zeros(units.size), where=duration > 0)
        return float(inside.sum()), float((flops * share).sum() / 1e9)

    def matmul_family(self, events: EventTable) -> np.ndarray:
        """Per unit: whether it is a matrix multiply (linear, mm, addmm, bmm, ...), not a convolution."""
        return events.name_mask(_is_matmul_op, self.units)

    def large(self, dur_us: np.ndarray) -> tuple[float, float]:
        """The large units' time (us) and FLOPs (GFLOP), those with a duration: what a large matmul
        achieves in this capture, on its threads and under the profiler (their rate: FLOPs over time)."""
        large = (self.unit_flops >= LARGE_MATMUL_FLOPS) & (dur_us[self.units] > 0)
        return float(dur_us[self.units[large]].sum()), float(self.unit_flops[large].sum() / 1e9)

    def large_gflops(self, dur_us: np.ndarray) -> float:
        """The large units' rate (GFLOP/s; 0 without one)."""
        us, gflop = self.large(dur_us)
        return gflop / us * 1e6 if us > 0 else 0.0


def arithmetic(events: EventTable, tree: HostTree, times: OpTimes) -> Arithmetic:
    """The span's matmul units and the leaves outside them (see the module docstring)."""
    ops = times.op_mask & main_thread_mask(events)
    rows = np.flatnonzero(ops)
    flops = event_flops(events, rows)
    with_flops = np.isfinite(flops) & (flops > 0)
    # Each event's nearest enclosing (or own) operator with FLOPs; a unit is one whose parent has none.
    owner = np.full(len(events), -1, dtype=np.int64)
    owner[rows[with_flops]] = rows[with_flops]
    owner = tree.inherit(owner)
    parent = tree.parent[rows]
    outermost = with_flops & ((parent < 0) | (owner[np.maximum(parent, 0)] < 0))
    # An operator that calls others through Python frames (a compiled graph's `CompiledFunction`) is no leaf.
    op_parent = operator_parent(events, tree)
    has_child = np.zeros(len(events), dtype=bool)
    has_child[op_parent[ops & (op_parent >= 0)]] = True
    leaves = np.flatnonzero(ops & ~has_child & (owner < 0))
    return Arithmetic(units=rows[outermost], unit_flops=flops[outermost], leaves=leaves)


def _is_matmul_op(name: str) -> bool:
    return name in MATMUL_OPS


def kept_matmul_us(unit_us: float, unit_gflop: float, rate_gflops: float) -> tuple[float, float]:
    """What batching keeps of the units' time (low end of the saving, high end): their FLOPs at
    `rate_gflops`, at most their time; unknown rate (0): all of it .. none."""
    if rate_gflops <= 0:
        return unit_us, 0.0
    kept = min(unit_us, unit_gflop / rate_gflops * 1e6)
    return kept, kept
