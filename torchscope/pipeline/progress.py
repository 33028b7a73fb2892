"""Progress of an analysis in bytes of trace text, reported to a `Progress(done, total)` callback."""

from __future__ import annotations

from typing import Any, Callable

from torchscope.trace.read import estimated_text_bytes

Progress = Callable[[int, int], None]  # (bytes of trace text analysed, bytes in all)


def no_progress(done: int, total: int) -> None:
    return None


class ByteProgress:
    """Bytes of trace text done: within a rank as its files are parsed, and exactly at each rank's end
    (a cached or failed file counts as done)."""

    def __init__(self, progress: Progress, groups: list[list[Any]]) -> None:
        self.progress = progress
        self.rank_bytes = [sum(estimated_text_bytes(ref.path) or 0 for ref in group) for group in groups]
        self.total = sum(self.rank_bytes)
        self.finished = 0  # bytes of the ranks that are done
        self.current = 0  # bytes parsed in the rank under way
        self.ranks_done = 0
        progress(0, self.total)

    def parsed(self, nbytes: int) -> None:
        """Bytes parsed in the rank under way (ranks run in order here). Capped at the rank's size: a
        parse that falls back and starts over reports its bytes twice."""
        limit = self.rank_bytes[self.ranks_done] if self.ranks_done < len(self.rank_bytes) else 0
        self.current = min(self.current + nbytes, limit)
        self.progress(self.finished + self.current, self.total)

    def rank_done(self, index: int) -> None:
        self.finished += self.rank_bytes[index]
        self.ranks_done += 1
        self.current = 0
        self.progress(self.finished, self.total)
