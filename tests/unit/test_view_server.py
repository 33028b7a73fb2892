"""`torchscope view`'s server without a browser: the run list's two-run picker, `/diff` of two runs of the
logdir (the same page `torchscope diff --format html` writes, from the server's cached analyses) and the
clean 4xx pages for a bad pair (not two runs, a run outside the logdir, a name that is no run)."""

from __future__ import annotations

import http.client
import shutil
import threading
from pathlib import Path
from typing import Iterator

import pytest

from torchscope.pipeline.diff import diff_paths
from torchscope.render.diff_html import render_diff_html
from torchscope.server.app import make_server

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
RUNS = ("gloo", "tb")  # two small real traces: a CPU gloo rank and a CUDA run


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("view")
    shutil.copytree(TRACES / "hta_cpu_only_gloo", root / "runs" / "gloo")
    shutil.copytree(TRACES / "tb_unit", root / "runs" / "tb")
    shutil.copytree(TRACES / "triton_single", root / "outside")
    return root / "runs"


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[tuple[str, int]]:
    httpd = make_server(logdir, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _get(server: tuple[str, int], path: str) -> tuple[int, str, str]:
    """Status, content type and body of a GET of `path`, sent as is (no `..` normalised away)."""
    conn = http.client.HTTPConnection(*server, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read().decode("utf-8")
    conn.close()
    return response.status, response.getheader("Content-Type") or "", body


def test_the_run_list_picks_two_runs_for_compare_and_diff(server: tuple[str, int]) -> None:
    status, _, body = _get(server, "/")
    assert status == 200
    for name in RUNS:
        assert f"<input type=checkbox name=run value='{name}'" in body
    assert "formaction='/compare'" in body and "formaction='/diff'" in body
    assert "<form id='pick' method='get' action='/compare'>" in body


def test_diff_renders_the_diff_of_two_runs(server: tuple[str, int], logdir: Path) -> None:
    status, kind, body = _get(server, "/diff?a=gloo&b=tb")
    assert status == 200 and kind.startswith("text/html")
    expected = render_diff_html(diff_paths(logdir / "gloo", logdir / "tb", jobs=1, use_cache=False))
    # The same renderer on the same Reports; only the run paths differ (names here, paths on the CLI).
    assert body.count("<tr>") == expected.count("<tr>") > 5
    assert "base gloo (1 steps) vs new tb (1 steps)" in body
    assert "the runs ran on different devices (cpu and cuda)" in body
    assert "href='/compare?a=gloo&amp;b=tb'" in body  # back to the runs side by side
    # The picker's form sends ?run=A&run=B: the same diff.
    assert _get(server, "/diff?run=gloo&run=tb")[2] == body
    reverse = _get(server, "/diff?a=tb&b=gloo")[2]
    assert "base tb (1 steps) vs new gloo (1 steps)" in reverse


def test_compare_links_to_the_diff(server: tuple[str, int]) -> None:
    status, _, body = _get(server, "/compare?run=gloo&run=tb")
    assert status == 200
    assert "src='/run/gloo/'" in body and "src='/run/tb/'" in body
    assert "href='/diff?a=gloo&amp;b=tb'" in body


@pytest.mark.parametrize("query", ["", "?a=gloo", "?run=gloo", "?run=gloo&run=tb&run=gloo", "?a=gloo&b=tb&b=gloo"])
@pytest.mark.parametrize("route", ["/diff", "/compare"])
def test_not_two_runs_is_a_400_page(server: tuple[str, int], route: str, query: str) -> None:
    status, kind, body = _get(server, route + query)
    assert status == 400 and kind.startswith("text/html")
    assert "pick exactly two runs" in body and "<a href='/'>all runs</a>" in body


@pytest.mark.parametrize("other", ["../outside", "..%2Foutside", "%2e%2e/outside", "/etc", ".", "missing",
                                   "%3Cscript%3Ealert(1)%3C%2Fscript%3E"])
@pytest.mark.parametrize("route", ["/diff", "/compare"])
def test_a_run_not_in_the_logdir_is_a_404_page(server: tuple[str, int], route: str, other: str) -> None:
    status, kind, body = _get(server, f"{route}?a=gloo&b={other}")
    assert status == 404 and kind.startswith("text/html")
    assert "not a run of this logdir" in body
    assert "<script>" not in body  # the name is shown escaped
