"""The analysis registry: every analysis has one shape, a per-span *extract* and a per-run *reduce*.

* `extract(span: SpanInput) -> E` runs once per trace file, where the tables are (a pool worker). Its
  result is a small msgspec struct of type `extract_type`: it crosses the process pool and is cached per
  file under the analysis's own fingerprint, so an unchanged trace is never re-analysed and a changed
  analysis recomputes only itself.
* `reduce(parts) -> {report field: value}` runs once per run over every span's extract, in rank then
  capture order, each with its `SpanKey` (rank, span index, step count and step time as weights). It
  fills the Report fields named in `fills`; an analysis registered from outside torchscope fills
  `extra.<name>`.
* A *sidecar* analysis (`sidecar=True`) produces run-level data too large or too detailed for the Report
  (timeline lanes, memory events by address, collectives by sequence number): its reduce returns
  `{name: value}` for the names in `fills`, and the pipeline hands them back beside the Report
  (`RunAnalysis.sidecars`, written under the run directory's `sidecars/`), never inside it.

The built-in analyses are listed in one place, `analysis/catalogue.py`; `register()` adds one more.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

import msgspec

from torchscope.analysis.span import SpanInput

E = TypeVar("E")


class SpanKey(msgspec.Struct, kw_only=True, frozen=True):
    """Where an extract comes from, and its weights in run-level means."""

    rank: int
    worker: str
    file: str
    span: int  # index of the span within its rank, in capture order
    steps: int
    step_us: float  # total step time of the span
    has_device: bool


class Part(msgspec.Struct, Generic[E], kw_only=True, frozen=True):
    """One span's extract with its key."""

    key: SpanKey
    value: E


class Analysis(msgspec.Struct, Generic[E], frozen=True):
    """One registered analysis (see the module docstring)."""

    name: str
    extract: Callable[[SpanInput], E]
    extract_type: Any  # the type `extract` returns (a msgspec struct, or Optional of one)
    reduce: Callable[[list[Part[E]]], dict[str, Any]]
    fills: tuple[str, ...] = ()
    sidecar: bool = False

    def targets(self) -> tuple[str, ...]:
        """What `reduce` may return: Report fields (`measurements.<section>`, `extra.<name>`), or the names
        of sidecars."""
        return self.fills or ((self.name,) if self.sidecar else (f"extra.{self.name}",))


_REGISTERED: list[Analysis[Any]] = []


def register(analysis: Analysis[Any]) -> Analysis[Any]:
    """Add an analysis to every later run (replacing one of the same name); returns it. Its results go
    to `report.extra[analysis.name]` unless it names Report fields in `fills`."""
    unregister(analysis.name)
    _REGISTERED.append(analysis)
    return analysis


def unregister(name: str) -> None:
    _REGISTERED[:] = [a for a in _REGISTERED if a.name != name]


def registered() -> tuple[Analysis[Any], ...]:
    """The analyses added with `register`, in order."""
    return tuple(_REGISTERED)
