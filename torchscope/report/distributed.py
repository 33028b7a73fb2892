"""The across-ranks section of the Report: collectives matched across ranks, waiting vs transfer, the
straggler and why it is late, and per-rank figures summarised so they stay readable at 1,024 ranks.

Times are microseconds per step (mean over the rank's steps) unless a name says otherwise; see
docs/distributed.md for how each figure is computed.
"""

from __future__ import annotations

from typing import Literal, Optional

import msgspec

MatchMethod = Literal["sequence", "order", "none"]
LatePhase = Literal["data_loading", "forward", "backward", "optimizer", "outside_step"]


class RankDistributed(msgspec.Struct, kw_only=True):
    """One rank's side of the collectives, and its phase times (for the straggler comparison)."""

    rank: int
    steps: int
    step_us: float = 0.0
    comm_us_per_step: float = 0.0  # time inside collectives (waiting + transfer)
    wait_us_per_step: float = 0.0  # waiting for the latest arrival
    transfer_us_per_step: float = 0.0  # the shortest instance across ranks of each collective
    exposed_transfer_us_per_step: float = 0.0  # transfer not overlapped with compute on this rank
    lateness_us_per_step: float = 0.0  # how much later than the median other rank it arrives
    clock_offset_us: float = 0.0  # its clock minus the reference rank's (ends of the same collectives)
    phases_us_per_step: dict[str, float] = {}
    # GPU traces (HTA's definitions, over the whole trace): percent of the device's traced span.
    idle_pct: Optional[float] = None
    compute_pct: Optional[float] = None
    non_compute_pct: Optional[float] = None
    comm_compute_overlap_pct: Optional[float] = None  # share of communication time overlapped by compute
    overlap_pct_by_step: dict[str, float] = {}  # step number -> the same within that step


class StepLateness(msgspec.Struct, kw_only=True):
    """The rank that arrived last at a step's collectives, and by how much (vs the median other rank)."""

    step: int
    late_rank: int
    lateness_us: float


class Straggler(msgspec.Struct, kw_only=True):
    """The rank the others wait for, and why (its phase times against the median other rank's)."""

    rank: int
    median_lateness_us: float  # over steps: robust to one step's hiccup; what the finding costs
    mean_lateness_us: float
    lateness_us_by_step: dict[str, float]  # step number -> us
    late_steps: int  # steps in which it arrived last
    steps: int
    late_phase: Optional[LatePhase] = None
    phase_excess_us_per_step: dict[str, float] = {}
    culprits_us_per_step: dict[str, float] = {}  # readable operator/frame name -> excess us per step


class CollectiveSummary(msgspec.Struct, kw_only=True):
    """One collective (by group and name) over the run: calls per rank, transfer and waiting."""

    name: str
    group: str
    calls: int  # matched instances
    ranks: int
    mean_transfer_us: float
    mean_wait_us: float  # per rank and instance
    mean_nelems: float = 0.0


class RankStat(msgspec.Struct, kw_only=True):
    """A per-rank metric summarised for many ranks: min / median / max and the worst ranks."""

    metric: str
    min: float
    median: float
    max: float
    worst_ranks: list[int]


class Distributed(msgspec.Struct, kw_only=True):
    present: bool = False
    world_size: int = 0
    source: str = ""  # which events timed the collectives: kernel, backend, record_param_comms, c10d
    match_method: MatchMethod = "none"
    matched: int = 0  # collectives seen on two ranks or more
    unmatched: int = 0
    wait_us_per_step: float = 0.0  # mean over ranks
    transfer_us_per_step: float = 0.0
    exposed_transfer_us_per_step: float = 0.0
    ranks: list[RankDistributed] = []
    steps: list[StepLateness] = []
    straggler: Optional[Straggler] = None
    collectives: list[CollectiveSummary] = []
    stats: list[RankStat] = []
    notes: list[str] = []
