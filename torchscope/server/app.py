"""The HTTP side of `torchscope view`: routes, the run-list page, and the server itself.

Routes (GET only): `/` the run list; `/runs.json` the same as data; `/run/<name>/` a run's dashboard
(rendered on demand); `/compare?a=<name>&b=<name>` two dashboards side by side. Anything else, and any
name that is not a run of the logdir, is a 404: a request never reaches a file outside it.
"""

from __future__ import annotations

import html
import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import msgspec

from torchscope.errors import InputError
from torchscope.render.html import render_html
from torchscope.server.runs import RunCache, RunSummary, find_runs

log = logging.getLogger(__name__)

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; frame-src 'self'"
_STYLE = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#1d2433}table{border-collapse:collapse}"
    "th,td{padding:4px 10px;border-bottom:1px solid #d8dde6;text-align:left}td.num{text-align:right}"
    "iframe{width:49.5%;height:90vh;border:1px solid #d8dde6}"
)


def make_server(logdir: Path, host: str = "127.0.0.1", port: int = 6007) -> ThreadingHTTPServer:
    """A server over `logdir` bound to host:port (port 0: any free port), not yet serving."""
    cache = RunCache(logdir)

    class Handler(_Handler):
        runs = cache

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


class _Handler(BaseHTTPRequestHandler):
    runs: RunCache
    server_version = "torchscope-view"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlsplit(self.path)
        path = unquote(url.path)
        try:
            if path == "/":
                self._send(200, "text/html", self._run_list_page())
            elif path == "/runs.json":
                rows = [msgspec.structs.asdict(s) for s in self._summaries()]
                self._send(200, "application/json", json.dumps(rows))
            elif path.startswith("/run/") and path.endswith("/"):
                analysed = self.runs.analysis(path[len("/run/") : -1])
                self._send(200, "text/html", render_html(analysed.report, analysed.sidecars))
            elif path == "/compare":
                query = parse_qs(url.query)
                self._send(200, "text/html", _compare_page(query.get("a", [""])[0], query.get("b", [""])[0]))
            else:
                self._send(404, "text/plain", "not found")
        except InputError as exc:
            self._send(404, "text/plain", f"not found: {exc}")

    def _summaries(self) -> list[RunSummary]:
        return [self.runs.summary(name) for name in find_runs(self.runs.logdir)]

    def _run_list_page(self) -> str:
        rows = "".join(_run_row(s) for s in self._summaries()) or "<tr><td colspan=4>no runs yet</td></tr>"
        return _page(
            "torchscope runs",
            f"<h1>Runs in {html.escape(str(self.runs.logdir))}</h1>"
            "<table id='runs'><thead><tr><th>run</th><th>step time</th><th>top finding</th><th>date</th></tr></thead>"
            f"<tbody>{rows}</tbody></table><p>New runs appear when this page is reloaded. Open two side by side: "
            "/compare?a=RUN&amp;b=RUN</p>",
        )

    def _send(self, status: int, kind: str, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        if kind == "text/html":
            self.send_header("Content-Security-Policy", _CSP)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("view: " + format, *args)  # requests at DEBUG, not on stderr


def _run_row(s: RunSummary) -> str:
    link = f"/run/{quote(s.name)}/"
    step = f"{s.mean_step_us / 1000:.2f} ms" if s.mean_step_us is not None else "-"
    top = s.error or s.top_finding
    return (
        f"<tr><td><a href='{html.escape(link, quote=True)}'>{html.escape(s.name)}</a></td>"
        f"<td class=num>{step}</td><td>{html.escape(top)}</td><td>{html.escape(s.date)}</td></tr>"
    )


def _compare_page(a: str, b: str) -> str:
    frames = "".join(f"<iframe title='{html.escape(n, quote=True)}' src='/run/{html.escape(quote(n), quote=True)}/'></iframe>" for n in (a, b))
    return _page("torchscope: two runs", f"<p><a href='/'>all runs</a></p>{frames}")


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><link rel=icon href='data:,'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )
