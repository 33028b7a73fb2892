"""The HTTP side of `torchscope view`: routes, the run-list page, and the server itself.

Routes (GET only): `/` the run list (tick two runs to compare or diff them); `/runs.json` the same as
data; `/run/<name>/` a run's dashboard (rendered on demand); `/compare?a=<name>&b=<name>` two dashboards
side by side; `/diff?a=<name>&b=<name>` what changed from run a to run b (`torchscope diff`'s HTML page,
from the cached analyses). `/compare` and `/diff` also take the run list's `?run=<name>&run=<name>`.
Anything else, and any name that is not a run of the logdir, is a 404 page; a pair that is not two run
names is a 400 page: a request never reaches a file outside the logdir.
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
from torchscope.pipeline.diff import diff_reports
from torchscope.render.diff_html import render_diff_html
from torchscope.render.html import render_html
from torchscope.server.runs import RunCache, RunSummary, find_runs, resolve_run

log = logging.getLogger(__name__)

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; frame-src 'self'"
_STYLE = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#1d2433}table{border-collapse:collapse}"
    "th,td{padding:4px 10px;border-bottom:1px solid #d8dde6;text-align:left}td.num{text-align:right}"
    "iframe{width:49.5%;height:90vh;border:1px solid #d8dde6}"
)


class _BadRequest(Exception):
    """A request the server understands but cannot answer as asked (a 400)."""


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
                a, b = self._two_runs(url.query)
                self._send(200, "text/html", _compare_page(a, b))
            elif path == "/diff":
                a, b = self._two_runs(url.query)
                self._send(200, "text/html", self._diff_page(a, b))
            else:
                self._send(404, "text/html", _error_page("not found", path))
        except _BadRequest as exc:
            self._send(400, "text/html", _error_page("bad request", str(exc)))
        except InputError as exc:
            self._send(404, "text/html", _error_page("not found", str(exc)))

    def _two_runs(self, query: str) -> tuple[str, str]:
        """The two run names of `?a=&b=` or of the run list's `?run=&run=`; each must be a run of the
        logdir (InputError, a 404, otherwise)."""
        fields = parse_qs(query)
        names = [*fields.get("a", []), *fields.get("b", [])] if "a" in fields or "b" in fields else fields.get("run", [])
        if len(names) != 2:
            raise _BadRequest(f"pick exactly two runs (got {len(names)})")
        for name in names:
            resolve_run(self.runs.logdir, name)
        return names[0], names[1]

    def _diff_page(self, a: str, b: str) -> str:
        """`torchscope diff a b` as HTML, from the two runs' cached analyses, under a link back."""
        diff = diff_reports(self.runs.analysis(a).report, self.runs.analysis(b).report, a, b)
        back = (f"<p><a href='/'>all runs</a> &middot; <a href='{html.escape(_pair_url('/compare', a, b), quote=True)}'>"
                "side by side</a></p>")
        return render_diff_html(diff).replace("<body>", "<body>" + back, 1)

    def _summaries(self) -> list[RunSummary]:
        return [self.runs.summary(name) for name in find_runs(self.runs.logdir)]

    def _run_list_page(self) -> str:
        rows = "".join(_run_row(s) for s in self._summaries()) or "<tr><td colspan=5>no runs yet</td></tr>"
        return _page(
            "torchscope runs",
            f"<h1>Runs in {html.escape(str(self.runs.logdir))}</h1><form id='pick' method='get' action='/compare'>"
            "<table id='runs'><thead><tr><th></th><th>run</th><th>step time</th><th>top finding</th><th>date</th></tr></thead>"
            f"<tbody>{rows}</tbody></table><p><button formaction='/compare'>open side by side</button> "
            "<button formaction='/diff'>diff</button> the two ticked runs (the first ticked is the base).</p>"
            "<p>New runs appear when this page is reloaded.</p></form>",
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
    tick = f"<input type=checkbox name=run value='{html.escape(s.name, quote=True)}' aria-label='pick {html.escape(s.name, quote=True)}'>"
    return (
        f"<tr><td>{tick}</td><td><a href='{html.escape(link, quote=True)}'>{html.escape(s.name)}</a></td>"
        f"<td class=num>{step}</td><td>{html.escape(top)}</td><td>{html.escape(s.date)}</td></tr>"
    )


def _compare_page(a: str, b: str) -> str:
    frames = "".join(f"<iframe title='{html.escape(n, quote=True)}' src='/run/{html.escape(quote(n), quote=True)}/'></iframe>" for n in (a, b))
    diff = html.escape(_pair_url("/diff", a, b), quote=True)
    return _page("torchscope: two runs", f"<p><a href='/'>all runs</a> &middot; <a href='{diff}'>diff these runs</a></p>{frames}")


def _pair_url(route: str, a: str, b: str) -> str:
    return f"{route}?a={quote(a, safe='')}&b={quote(b, safe='')}"


def _error_page(title: str, detail: str) -> str:
    return _page(f"torchscope: {title}", f"<h1>{html.escape(title)}</h1><p>{html.escape(detail)}</p><p><a href='/'>all runs</a></p>")


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><link rel=icon href='data:,'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )
