"""JSON renderer: the Report as one JSON document (see docs/json-schema.md)."""

from __future__ import annotations

import msgspec

from torchscope.render.registry import RenderOptions, register
from torchscope.report.model import Report


def render_json(report: Report, indent: int = 2) -> str:
    return msgspec.json.format(msgspec.json.encode(report), indent=indent).decode()


class JsonRenderer:
    name = "json"
    extension = ".json"

    def render(self, report: Report, options: RenderOptions) -> str:
        return render_json(report)


register(JsonRenderer())
