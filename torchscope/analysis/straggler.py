"""Which rank the others wait for, in each step and on average, and why it is late.

Lateness needs no clock alignment: in every step, a rank that arrives late at the collectives waits less
in them than the others. A rank's lateness in a step is the median time the *other* ranks waited in that
step's collectives minus its own (for two ranks, simply the difference).

Why it is late: its mean time per step in each phase (data loading, forward, backward, optimizer, and
the step time outside them) against the median other rank's; the phase with the largest excess is the
`late_phase` (when it holds at least half of the rank's extra time; otherwise every phase is a little
slower, which points at the host rather than at one phase's work), and the operators and Python frames with the largest excess in that phase are the culprits,
the user's own frames first (they are where a fix goes).
"""

from __future__ import annotations

import re

import numpy as np

from torchscope.analysis.collective_match import CollectiveTable
from torchscope.analysis.collectives import RankCollectives
from torchscope.analysis.frames import is_user_frame, readable
from torchscope.arrays import median, nanmedian
from torchscope.report.distributed import LatePhase, StepLateness, Straggler

PHASE_NAMES: dict[str, LatePhase] = {
    "data_loading": "data_loading",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "outside_step",
}
EXPLAINS_SHARE = 0.25  # a phase named as the cause holds at least this share of the lateness
DOMINANT_SHARE = 0.5  # the late phase holds at least half of the rank's extra time, else no phase is named
CULPRIT_SHARE = 0.3  # a culprit explains at least this share of the late phase's excess
MAX_CULPRITS = 5


def _nanmedians(rows: np.ndarray) -> np.ndarray:
    """`np.nanmedian(rows, axis=1)` without importing numpy.ma (which it does, ~15 ms): the same values,
    byte for byte (+ 0.0: np.nanmedian gives 0.0 where the plain arithmetic gives -0.0)."""
    return np.array([nanmedian(row) for row in rows], dtype=np.float64).reshape(-1) + 0.0


def median_of_others(values: np.ndarray) -> np.ndarray:
    """Per row r of `values` (ranks x columns): the median of the other rows, column by column (NaN
    entries, ranks without that step, are ignored; NaN where no other rank has a value).

    Each column is sorted once; the others of rank r are that order less r's own value, so their middle
    values are read at shifted positions: O(ranks log ranks) per column, not a median per rank. The same
    floats as `np.nanmedian` of the others: the middle value, or the two middle values' sum halved
    (+ 0.0, as in `_nanmedians`)."""
    n_ranks, n_columns = values.shape
    order = np.argsort(values, axis=0, kind="stable")  # NaNs last
    ordered = np.take_along_axis(values, order, axis=0)
    own = ~np.isnan(values)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(n_ranks)[:, None], order.shape), axis=0)
    removed = np.where(own, position, n_ranks)  # r's own place in the order (past the values if NaN)
    others = own.sum(axis=0)[None, :] - own  # how many of the other ranks have a value

    def other(k: np.ndarray) -> np.ndarray:
        """The k-th smallest value of the others of each rank."""
        at = np.where(k < removed, k, k + 1)
        return np.take_along_axis(ordered, np.clip(at, 0, max(n_ranks - 1, 0)), axis=0)

    middle = others // 2
    with np.errstate(all="ignore"):
        upper = other(middle)
        median = np.where(others % 2 == 1, upper, (other(middle - 1) + upper) / 2)
    return np.where(others > 0, median + 0.0, np.nan) if n_columns else np.full(values.shape, np.nan)


def wait_matrix(table: CollectiveTable, n_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers, ranks x steps waiting time in us; NaN where a rank has no instance in the step)."""
    inside = table.step >= 0
    steps, column = np.unique(table.step[inside], return_inverse=True)
    waits = np.zeros((n_ranks, steps.size))
    seen = np.zeros((n_ranks, steps.size), dtype=bool)
    np.add.at(waits, (table.rank[inside], column), (table.wait_us * table.weight)[inside])
    seen[table.rank[inside], column] = True
    return steps, np.where(seen, waits, np.nan)


def lateness(table: CollectiveTable, ranks: list[int]) -> tuple[np.ndarray, np.ndarray, list[StepLateness]]:
    """(step numbers, ranks x steps lateness in us, the late rank of each step)."""
    steps, waits = wait_matrix(table, len(ranks))
    if steps.size == 0 or len(ranks) < 2:
        return steps, np.zeros((len(ranks), steps.size)), []
    late = median_of_others(waits) - waits
    filled = np.where(np.isnan(late), -np.inf, late)
    worst = np.argmax(filled, axis=0)
    rows = [
        StepLateness(step=int(s), late_rank=ranks[int(w)], lateness_us=float(max(filled[w, i], 0.0)))
        for i, (s, w) in enumerate(zip(steps.tolist(), worst.tolist()))
    ]
    return steps, late, rows


def per_step_phases(spans: list[RankCollectives]) -> dict[str, float]:
    """A rank's mean time per step in each phase."""
    steps = sum(len(s.step_numbers) for s in spans)
    totals: dict[str, float] = {}
    for span in spans:
        for phase, values in span.phase_us.items():
            totals[phase] = totals.get(phase, 0.0) + float(sum(values))
    return {p: v / steps for p, v in totals.items()} if steps else {}


def straggler(
    ranks: list[int], extracts: list[list[RankCollectives]], steps: np.ndarray, late: np.ndarray, phases: list[dict[str, float]]
) -> Straggler | None:
    """The rank with the largest median lateness over the steps (a rank late in most steps, not one whose
    single step had a hiccup), its late phase and culprits (None without lateness)."""
    if late.size == 0:
        return None
    with np.errstate(all="ignore"):
        typical = np.nan_to_num(_nanmedians(late), nan=-np.inf)
        mean_late = np.nanmean(late, axis=1)
    index = int(np.argmax(typical))
    if not np.isfinite(typical[index]) or typical[index] <= 0:
        return None
    mine = late[index]
    filled = np.where(np.isnan(late), -np.inf, late)
    late_steps = int((np.argmax(filled, axis=0) == index).sum())
    excess = _phase_excess(index, phases)
    phase = max(excess, key=lambda p: excess[p]) if excess and max(excess.values()) > 0 else None
    if phase is not None and excess[phase] < DOMINANT_SHARE * sum(max(v, 0.0) for v in excess.values()):
        phase = None  # every phase a little slower: a slower or busier host, not one phase's work
    if phase is not None and excess[phase] < EXPLAINS_SHARE * typical[index]:
        phase = None  # 2 us more in the forward is no cause of a 40 ms lateness
    return Straggler(
        rank=ranks[index],
        median_lateness_us=float(typical[index]),
        mean_lateness_us=float(mean_late[index]),
        lateness_us_by_step={str(int(s)): float(v) for s, v in zip(steps.tolist(), mine.tolist()) if not np.isnan(v)},
        late_steps=late_steps,
        steps=int(steps.size),
        late_phase=PHASE_NAMES[phase] if phase else None,
        phase_excess_us_per_step={PHASE_NAMES[p]: v for p, v in excess.items()},
        culprits_us_per_step=_culprits(index, extracts, phase, excess.get(phase, 0.0)) if phase else {},
    )


def _phase_excess(index: int, phases: list[dict[str, float]]) -> dict[str, float]:
    others = [p for i, p in enumerate(phases) if i != index]
    return {
        phase: phases[index].get(phase, 0.0) - median(np.array([o.get(phase, 0.0) for o in others]))
        for phase in PHASE_NAMES
        if others
    }


def _culprit_rates(spans: list[RankCollectives], phase: str) -> dict[str, float]:
    steps = sum(len(s.step_numbers) for s in spans)
    rates: dict[str, float] = {}
    for span in spans:
        for name, us in span.culprits_us.get(phase, {}).items():
            rates[name] = rates.get(name, 0.0) + us / max(steps, 1)
    return rates


def _is_python(name: str) -> bool:
    """A Python frame or built-in call (not an operator or a range)."""
    return name.startswith("<built-in") or re.match(r"^[^()]*\(\d+\): ", name) is not None


def _culprits(index: int, extracts: list[list[RankCollectives]], phase: str, phase_excess: float) -> dict[str, float]:
    """The straggler's operators and frames with the most extra time in `phase` against the median other
    rank, readable, the user's own frames first."""
    mine = _culprit_rates(extracts[index], phase)
    others = [_culprit_rates(spans, phase) for i, spans in enumerate(extracts) if i != index]
    excess = {name: us - median(np.array([o.get(name, 0.0) for o in others])) for name, us in mine.items()}
    wanted = [n for n, v in excess.items() if v >= CULPRIT_SHARE * phase_excess and v > 0]
    if any(is_user_frame(n) for n in wanted):  # then library frames and built-ins inside them say nothing more
        wanted = [n for n in wanted if is_user_frame(n) or not _is_python(n)]
    wanted.sort(key=lambda n: (not is_user_frame(n), -excess[n]))
    out: dict[str, float] = {}
    for name in wanted:
        out.setdefault(readable(name), excess[name])
        if len(out) == MAX_CULPRITS:
            break
    return out
