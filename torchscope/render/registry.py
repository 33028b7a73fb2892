"""One protocol for every renderer and one registry of them, used by `analyze`, the end-of-run report and
later the HTML dashboard and diff: a renderer takes a finished Report and returns text; it never
computes an analysis."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import msgspec

from torchscope.report.model import Report


class RenderOptions(msgspec.Struct, frozen=True):
    """Presentation choices; a renderer uses those that apply to it."""

    width: int | None = None  # terminal columns (None: 100)
    color: bool = False  # ANSI colours
    by_shape: bool = False  # operator table grouped by input shapes
    top: int = 10  # rows per table
    # Run-level data kept beside the Report (`pipeline.analyze_run`), by name: the html page draws the
    # timeline lanes from it. Passed, never computed, by the renderer.
    sidecars: Mapping[str, Any] = msgspec.field(default_factory=dict)


class Renderer(Protocol):
    name: str  # the --format value
    extension: str  # of a file holding its output

    def render(self, report: Report, options: RenderOptions) -> str: ...


_RENDERERS: dict[str, Renderer] = {}


def register(renderer: Renderer) -> Renderer:
    _RENDERERS[renderer.name] = renderer
    return renderer


def renderer(name: str) -> Renderer:
    """The renderer registered as `name` (KeyError if none)."""
    return _RENDERERS[name]


def formats() -> tuple[str, ...]:
    return tuple(_RENDERERS)
