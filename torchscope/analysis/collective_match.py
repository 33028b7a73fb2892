"""Collective instances of every rank matched into collectives, with waiting, transfer and clock offsets.

* Matching: by (process group, collective, sequence number) when every instance has a `Seq`; otherwise by
  (step, process group, collective, order of occurrence within the step), which holds as long as every
  rank issues the same collectives in the same order, as DDP, FSDP and hand-written loops do.
* Waiting vs transfer: a collective cannot finish on any rank before the last rank has arrived, so the
  shortest instance across ranks is the best estimate of its transfer time; the rest of each rank's
  instance is time spent waiting for the latest arrival (TensorBoard's distributed view does the same).
* Clocks: ranks leave a blocking collective at about the same moment, so a rank's clock offset against
  the reference rank is the median difference of the ends of the collectives both took part in.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis.collectives import RankCollectives
from torchscope.arrays import median


class CollectiveTable(msgspec.Struct, frozen=True):
    """Every rank's instances as flat arrays; `key` numbers the matched collectives 0..len(names)-1."""

    rank: np.ndarray  # index into the rank list
    key: np.ndarray
    step: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    overlap_us: np.ndarray
    weight: np.ndarray  # per instance: its share in per-step wall-time totals (concurrent instances)
    nelems: np.ndarray
    key_name: list[str]
    key_group: list[str]
    ranks_per_key: np.ndarray
    transfer_us: np.ndarray  # per instance: the shortest instance of its collective (its own if unmatched)
    wait_us: np.ndarray  # per instance: its time beyond the transfer
    clock_offset_us: np.ndarray  # per rank index
    method: str
    source: str

    @property
    def matched(self) -> np.ndarray:
        """Per instance: whether its collective was seen on two ranks or more."""
        return self.ranks_per_key[self.key] >= 2


def collective_table(ranks: list[int], extracts: list[list[RankCollectives]]) -> CollectiveTable:
    """Match the instances of `extracts[i]` (the spans of rank `ranks[i]`) across ranks."""
    names: dict[str, int] = {}
    groups: dict[str, int] = {}
    columns: dict[str, list[np.ndarray]] = {c: [] for c in ("rank", "name", "group", "step", "ordinal", "seq", "start", "dur", "overlap", "weight", "nelems")}
    sources: list[str] = []
    for index, spans in enumerate(extracts):
        for span in spans:
            if not span.name_id:
                continue
            sources.append(span.source)
            name_map = np.array([names.setdefault(n, len(names)) for n in span.names], dtype=np.int64)
            group_map = np.array([groups.setdefault(g, len(groups)) for g in span.groups], dtype=np.int64)
            count = len(span.name_id)
            columns["rank"].append(np.full(count, index, dtype=np.int64))
            columns["name"].append(name_map[np.asarray(span.name_id, dtype=np.int64)])
            columns["group"].append(group_map[np.asarray(span.group_id, dtype=np.int64)])
            for column, values in (("step", span.step), ("ordinal", span.ordinal), ("seq", span.seq), ("nelems", span.nelems)):
                columns[column].append(np.asarray(values, dtype=np.int64))
            weight = span.weight or [1.0] * count
            for column, floats in (("start", span.start_us), ("dur", span.dur_us), ("overlap", span.compute_overlap_us), ("weight", weight)):
                columns[column].append(np.asarray(floats, dtype=np.float64))
    flat = {c: np.concatenate(v) if v else np.zeros(0) for c, v in columns.items()}
    return _match(len(ranks), flat, names, groups, sources)


def _match(n_ranks: int, flat: dict[str, np.ndarray], names: dict[str, int], groups: dict[str, int], sources: list[str]) -> CollectiveTable:
    seq = flat["seq"].astype(np.int64)
    by_sequence = seq.size > 0 and bool((seq >= 0).all())
    fields = ("group", "name", "seq") if by_sequence else ("step", "group", "name", "ordinal")
    stacked = np.stack([flat[f].astype(np.int64) for f in fields]) if seq.size else np.zeros((len(fields), 0), np.int64)
    unique, key = np.unique(stacked, axis=1, return_inverse=True) if seq.size else (stacked, np.zeros(0, np.int64))
    key = key.reshape(-1)
    n_keys = unique.shape[1]
    rank = flat["rank"].astype(np.int64)
    dur = flat["dur"].astype(np.float64)
    ranks_per_key = np.bincount(key, minlength=n_keys)
    shortest = np.full(n_keys, np.inf)
    np.minimum.at(shortest, key, dur)
    matched = ranks_per_key[key] >= 2
    transfer = np.where(matched, shortest[key], dur)
    end = flat["start"].astype(np.float64) + dur
    name_text = list(names)
    group_text = list(groups)
    name_row, group_row = fields.index("name"), fields.index("group")
    return CollectiveTable(
        rank=rank,
        key=key,
        step=flat["step"].astype(np.int64),
        start_us=flat["start"].astype(np.float64),
        dur_us=dur,
        overlap_us=flat["overlap"].astype(np.float64),
        weight=flat["weight"].astype(np.float64),
        nelems=flat["nelems"].astype(np.int64),
        key_name=[name_text[i] for i in unique[name_row].tolist()],
        key_group=[group_text[i] for i in unique[group_row].tolist()],
        ranks_per_key=ranks_per_key,
        transfer_us=transfer,
        wait_us=np.maximum(dur - transfer, 0.0),
        clock_offset_us=clock_offsets(n_ranks, rank, key, end, matched),
        method=("sequence" if by_sequence else "order") if seq.size else "none",
        source=max(set(sources), key=sources.count) if sources else "",
    )


def clock_offsets(n_ranks: int, rank: np.ndarray, key: np.ndarray, end_us: np.ndarray, matched: np.ndarray) -> np.ndarray:
    """Per rank: the median of (its end - the reference rank's end) over the collectives both took part
    in. The reference is the rank with the most matched instances (the lowest such rank)."""
    offsets = np.zeros(n_ranks)
    if not matched.any():
        return offsets
    reference = int(np.argmax(np.bincount(rank[matched], minlength=n_ranks)))
    reference_end = np.full(int(key.max()) + 1, np.nan)
    mine = matched & (rank == reference)
    reference_end[key[mine]] = end_us[mine]
    difference = end_us - reference_end[key]
    usable = matched & ~np.isnan(difference)
    order = np.argsort(rank[usable], kind="stable")
    sorted_rank, sorted_diff = rank[usable][order], difference[usable][order]
    bounds = np.searchsorted(sorted_rank, np.arange(n_ranks + 1))
    for r in range(n_ranks):  # one median per rank
        if bounds[r + 1] > bounds[r]:
            offsets[r] = median(sorted_diff[bounds[r] : bounds[r + 1]])  # np.median imports numpy.ma
    return offsets
