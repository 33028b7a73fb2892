"""The HTML renderer and the timeline-lanes sidecar, without a browser (tests/browser drives Chromium):
the data is embedded once and safely, the page is self-contained, and the level of detail holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import numpy as np
import pytest

from torchscope.analysis import timeline
from torchscope.render.html import DATA_ELEMENT_ID, embed_json, render_html
from torchscope.render.registry import RenderOptions, formats, renderer
from torchscope.report.model import Report, RunInfo

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
HOSTILE = "</script><!-- <img src=x onerror=alert(1)> \u2028\u2029 & '\""


def _minimal(name: str = "op") -> Report:
    report = Report(torchscope_version="0", run=RunInfo(paths=[name], trace_files=[], ranks=[0], device_kind="cpu"),
                    steps=[], breakdown={})
    return report


def _embedded(page: str) -> str:
    match = re.search(rf'<script type="application/json" id="{DATA_ELEMENT_ID}">(.*?)</script>', page, re.S)
    assert match is not None
    return match.group(1)


def test_html_is_a_registered_format() -> None:
    assert "html" in formats() and renderer("html").extension == ".html"


def test_embedded_json_has_no_markup_and_reads_back_exactly() -> None:
    text = embed_json({"name": HOSTILE})
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == {"name": HOSTILE}


def test_user_text_is_embedded_once_and_never_as_markup() -> None:
    page = render_html(_minimal(HOSTILE))
    assert page.count(f'id="{DATA_ELEMENT_ID}"') == 1 and "</script><!--" not in page and "<img" not in page
    assert json.loads(_embedded(page))["report"]["run"]["paths"] == [HOSTILE]
    assert not re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", page)


def test_the_page_is_self_contained() -> None:
    page = renderer("html").render(_minimal(), RenderOptions())
    assert not re.search(r'(src|href)=["\']?(https?:)?//', page.replace('href="https://ui.perfetto.dev/"', ""))
    assert "default-src 'none'" in page  # the CSP forbids any fetch, even of an injected image


def test_sidecars_other_than_the_timeline_stay_out() -> None:
    page = render_html(_minimal(), {"timeline": {"lanes": []}, "huge": list(range(10))})
    assert json.loads(_embedded(page))["sidecars"] == {"timeline": {"lanes": []}}


@pytest.fixture(scope="module")
def resnet_timeline() -> timeline.Timeline:
    from torchscope.pipeline.analyze import analyze_run

    return analyze_run(TRACES / "resnet50_num_workers_0", jobs=1, use_cache=False).sidecars["timeline"]


def test_timeline_has_host_device_and_phase_lanes_relative_to_the_first_event(resnet_timeline: timeline.Timeline) -> None:
    kinds = {lane.kind for lane in resnet_timeline.lanes}
    assert kinds == {"host", "device", "phase"}
    assert min(min(lane.start_us) for lane in resnet_timeline.lanes if lane.start_us) == 0.0
    for lane in resnet_timeline.lanes:
        assert len(lane.start_us) == len(lane.dur_us) == len(lane.name) == len(lane.depth) == len(lane.detail)
        assert max(lane.name, default=0) < len(resnet_timeline.strings)
    assert resnet_timeline.shown == resnet_timeline.events  # a small trace: nothing left out


def test_level_of_detail_keeps_the_longest_events_and_counts_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscope.pipeline.analyze import analyze_run

    monkeypatch.setattr(timeline, "MAX_EVENTS_PER_SPAN", 500)
    lanes = analyze_run(TRACES / "resnet50_num_workers_0", jobs=1, use_cache=False).sidecars["timeline"]
    events = [lane for lane in lanes.lanes if lane.kind != "phase"]
    assert lanes.shown == sum(len(lane.start_us) for lane in events) == 500 < lanes.events
    assert sum(sum(lane.hidden_count) for lane in events) == lanes.events - 500
    kept = min(min(lane.dur_us) for lane in events if lane.dur_us)
    assert all(len(lane.hidden_us) == len(lane.hidden_count) for lane in events)
    assert kept > 0


def test_timeline_sidecar_round_trips_through_msgpack(resnet_timeline: timeline.Timeline) -> None:
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(resnet_timeline), type=timeline.Timeline)
    assert back == resnet_timeline


def test_longest_picks_the_longest_in_time_order() -> None:
    chosen = timeline._longest(np.array([5.0, 1.0, 9.0, 3.0]), np.array([0.0, 1.0, 2.0, 3.0]), 2)
    assert chosen.tolist() == [0, 2]


def test_the_end_of_run_report_writes_the_dashboard_beside_the_traces(tmp_path: Path) -> None:
    import shutil

    from torchscope.cli import endreport
    from torchscope.rundir.layout import HTML_REPORT_NAME

    run_dir = tmp_path / "run"
    shutil.copytree(TRACES / "tb_unit", run_dir)
    assert endreport.write_html(endreport.build_run(run_dir), run_dir / HTML_REPORT_NAME)
    data = json.loads(_embedded((run_dir / HTML_REPORT_NAME).read_text(encoding="utf-8")))
    assert data["report"]["steps"] and data["sidecars"]["timeline"]["lanes"]
    assert not endreport.write_html(None, run_dir / "none.html")
