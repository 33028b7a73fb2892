"""HTML renderer: the Report (and the timeline sidecar) as ONE self-contained offline page.

The page is the committed front end (`render/assets/dashboard.{html,css,js}`, plain JS written here, no
build step) with the data embedded once, as JSON in a `<script type="application/json">` element. The
front end reads it with `JSON.parse` and inserts every user-derived string with `textContent`, so an
operator name or a `record_function` label is always text. Nothing here computes an analysis.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import msgspec

from torchscope.render.registry import RenderOptions, register
from torchscope.report.model import Report

DATA_ELEMENT_ID = "ts-data"
# Inside a <script> element the HTML parser ends the element at `</script` and treats `<!--` specially;
# JavaScript engines before ES2019 ended string literals at U+2028/2029. JSON allows each of these
# characters escaped as \uXXXX, and they can only occur inside JSON strings, so escaping them is exact.
_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SIDECARS_SHOWN = ("timeline",)  # the sidecars the page draws; others stay out of the file


def embed_json(data: Any) -> str:
    """`data` as JSON text that is safe inside a `<script>` element (no `<`, `>`, `&`, U+2028/2029)."""
    text = msgspec.json.encode(data).decode("utf-8")
    for char, escaped in _ESCAPES.items():
        text = text.replace(char, escaped)
    return text


def render_html(report: Report, sidecars: Mapping[str, Any] | None = None) -> str:
    """The dashboard page for `report`, with the timeline lanes when `sidecars` holds them."""
    shown = {name: value for name, value in (sidecars or {}).items() if name in _SIDECARS_SHOWN}
    payload = embed_json({"report": report, "sidecars": shown})
    page, css = _asset("dashboard.html"), _asset("dashboard.css")
    script = _asset("view_memory.js") + _asset("view_distributed.js") + _asset("view_modules.js") + _asset("dashboard.js")  # views in their own files, defined first
    head, rest = page.split("/*CSS*/", 1)
    middle, tail = rest.split("/*DATA*/", 1)
    before_js, after_js = tail.split("/*JS*/", 1)
    return "".join((head, css, middle, payload, before_js, script, after_js))


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return resources.files("torchscope.render").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


class HtmlRenderer:
    """`--format html`: the dashboard (docs/html.md); sidecars come in `RenderOptions.sidecars`."""

    name = "html"
    extension = ".html"

    def render(self, report: Report, options: RenderOptions) -> str:
        return render_html(report, options.sidecars)


register(HtmlRenderer())
