"""`torchscope view` over a logdir of two runs: the run list, both dashboards in the browser, paths
confined to the logdir (`..`, a symlink out), a run created after the start, two runs picked from the
list and diffed or opened side by side, and the CLI's own start."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from browser_env import TRACES, VIEWS, Page
from helpers.signals import default_signals


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[str]:
    from torchscope.server.app import make_server

    httpd = make_server(logdir, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _status(base: str, path: str) -> int:
    """The status of a GET of `path` sent as is (http.client does not normalise `..`)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path)
    status = conn.getresponse().status
    conn.close()
    return status


def _run_names(tab: Any) -> list[str]:
    return [str(t) for t in tab.locator("#runs tbody tr td:nth-child(2) a").all_inner_texts()]


def test_lists_two_runs_and_serves_both(page: Page, server: str) -> None:
    tab = page.page
    tab.goto(server + "/")
    assert _run_names(tab) == ["hta_two_ranks_nccl", "resnet50_num_workers_0"]
    assert "ms" in tab.locator("#runs tbody tr").first.inner_text()
    for name in ("hta_two_ranks_nccl", "resnet50_num_workers_0"):
        tab.goto(server + "/")
        tab.click(f"text={name}")
        tab.wait_for_selector("#view-overview.active")
        for view in VIEWS:
            tab.click(f"#ts-nav button[data-view={view}]")
            assert tab.locator(f"#view-{view} .card").count() >= 1
    assert page.errors == []


def test_refuses_paths_out_of_the_logdir(server: str) -> None:
    assert _status(server, "/run/resnet50_num_workers_0/") == 200
    for path in ("/run/../outside/", "/run/%2e%2e/outside/", "/run/resnet50_num_workers_0/../../outside/",
                 "/run/escape/", "/run//etc/", "/run/.torchscope-cache/", "/etc/passwd", "/run/nonexistent/"):
        assert _status(server, path) == 404, path


def test_a_run_with_a_folder_linked_out_of_the_logdir_is_refused(server: str, logdir: Path) -> None:
    sneaky = logdir / "sneaky"
    shutil.copytree(TRACES / "triton_single", sneaky)
    (sneaky / "more").symlink_to(logdir.parent / "outside", target_is_directory=True)
    try:
        assert _status(server, "/run/sneaky/") == 404
    finally:
        shutil.rmtree(sneaky)


def test_a_run_created_after_the_start_appears(page: Page, server: str, logdir: Path) -> None:
    tab = page.page
    tab.goto(server + "/")
    assert "late" not in _run_names(tab)
    shutil.copytree(TRACES / "tb_unit", logdir / "late")
    tab.reload()
    assert "late" in _run_names(tab)
    assert _status(server, "/run/late/") == 200
    shutil.rmtree(logdir / "late")


def test_compare_opens_two_runs_side_by_side(page: Page, server: str) -> None:
    tab = page.page
    tab.goto(server + "/compare?a=hta_two_ranks_nccl&b=resnet50_num_workers_0")
    for frame_name in ("hta_two_ranks_nccl", "resnet50_num_workers_0"):
        frame = tab.frame_locator(f"iframe[title='{frame_name}']")
        frame.locator("#view-overview.active").wait_for()
    assert page.errors == []


def test_two_runs_picked_in_the_list_are_diffed_and_compared(page: Page, server: str) -> None:
    tab = page.page
    tab.goto(server + "/")
    tab.check("input[name=run][value=hta_two_ranks_nccl]")
    tab.check("input[name=run][value=resnet50_num_workers_0]")
    tab.click("button[formaction='/diff']")
    tab.wait_for_selector("h1:has-text('torchscope diff')")
    assert tab.url.startswith(server + "/diff?")
    text = tab.locator("body").inner_text()
    assert "base hta_two_ranks_nccl" in text and "new resnet50_num_workers_0" in text
    assert "Step time" in text and tab.locator("table").count() >= 2
    tab.click("text=side by side")  # the diff page links to the two dashboards
    for frame_name in ("hta_two_ranks_nccl", "resnet50_num_workers_0"):
        tab.frame_locator(f"iframe[title='{frame_name}']").locator("#view-overview.active").wait_for()
    tab.click("text=diff these runs")  # and back
    tab.wait_for_selector("h1:has-text('torchscope diff')")
    tab.goto(server + "/")
    tab.check("input[name=run][value=resnet50_num_workers_0]")
    tab.click("button[formaction='/diff']")  # one run ticked: a clean 400 page, not a traceback
    assert "pick exactly two runs" in tab.locator("body").inner_text()
    assert _status(server, "/diff?a=resnet50_num_workers_0&b=../outside") == 404
    assert [e for e in page.errors if "400" not in e] == []  # Chromium logs the 400 itself as a console error


def test_the_view_command_listens_on_loopback_and_stops_on_interrupt(logdir: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "torchscope", "view", str(logdir), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert "serving" in line and "http://127.0.0.1:" in line
        base = line.split("at ")[1].split("/ ")[0]
        deadline = time.monotonic() + 30
        while _status(base, "/runs.json") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(2)
        assert proc.wait(timeout=30) == 130
