"""The summary of a PyTorch CUDA memory snapshot (`torchscope memory SNAPSHOT.pickle`): a JSON document
of its own, beside the Report (a snapshot is not a trace and has no steps)."""

from __future__ import annotations

from typing import Optional

import msgspec

SNAPSHOT_SCHEMA_VERSION = 1


class SnapshotSite(msgspec.Struct, kw_only=True):
    """Bytes held by the blocks allocated from one Python call site (`name (file.py:line)`)."""

    site: str
    bytes: int
    blocks: int


class SnapshotDevice(msgspec.Struct, kw_only=True):
    """One device's caching allocator: now (segments and blocks) and over the recorded history."""

    device: int
    segments: int = 0
    reserved_bytes: int = 0  # sum of the segments (what cudaMalloc gave the cache)
    allocated_bytes: int = 0  # blocks in use by tensors
    requested_bytes: int = 0  # what those tensors asked for (before rounding)
    inactive_bytes: int = 0  # cached, free for reuse
    largest_inactive_bytes: int = 0
    fragmentation: float = 0.0  # 1 - largest free block / free bytes (0: the free memory is one block)
    expandable_segments: bool = False
    top_sites: list[SnapshotSite] = []  # blocks allocated now, by call site
    history_entries: int = 0  # allocator actions recorded (`_record_memory_history`)
    peak_allocated_bytes: Optional[int] = None  # over the recorded history (None: no history)
    peak_sites: list[SnapshotSite] = []  # blocks alive at that peak, allocated within the history
    peak_unattributed_bytes: int = 0  # allocated at the peak by blocks older than the history
    segment_allocs: int = 0  # cudaMalloc calls of the allocator in the history
    segment_frees: int = 0  # cudaFree calls
    ooms: int = 0


class SnapshotSummary(msgspec.Struct, kw_only=True):
    schema_version: int = SNAPSHOT_SCHEMA_VERSION
    path: str
    devices: list[SnapshotDevice] = []
    warnings: list[str] = []
