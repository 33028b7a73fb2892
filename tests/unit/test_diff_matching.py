"""How `diff` matches operators and kernels between two hand-built Reports: by name, input shapes and
call site, at the finest grain both sides recorded (pipeline/diff.py `operator_keys`)."""

from __future__ import annotations

from torchscope.pipeline.diff import OTHER_SITES, diff_reports
from torchscope.report.diff import RowChange
from torchscope.report.model import CallSiteRow, KernelRow, OperatorRow, Report, RunInfo, StepRow

STEPS = 4
SITE_A = "forward (model.py:10)"
SITE_B = "loss_fn (train.py:42)"


def _report(ops: dict[tuple[str, str | None], tuple[int, float]], sites: dict[tuple[str, str], tuple[int, float]] | None = None,
            kernels: list[KernelRow] | None = None) -> Report:
    """`ops`: (name, shapes) -> (calls, self us); the name table is their sum. `sites`: (name, site) ->
    (calls, self us); None: a report without call sites (no stacks, or an older report)."""
    by_name: dict[str, OperatorRow] = {}
    for (name, _), (calls, us) in ops.items():
        row = by_name.setdefault(name, OperatorRow(name=name, calls=0, host_self_us=0.0, host_total_us=0.0))
        row.calls += calls
        row.host_self_us += us
    return Report(
        torchscope_version="test", run=RunInfo(paths=[], trace_files=[], ranks=[0], device_kind="cpu"),
        steps=[StepRow(rank=0, span=0, step=i, start_us=i * 1000.0, duration_us=1000.0, breakdown={}) for i in range(STEPS)],
        breakdown={},
        operators=list(by_name.values()),
        operators_by_shape=[OperatorRow(name=n, calls=c, host_self_us=us, host_total_us=us, input_shapes=s)
                            for (n, s), (c, us) in ops.items() if s is not None],
        call_sites=[CallSiteRow(operator=n, site=site, calls=c, host_self_us=us) for (n, site), (c, us) in (sites or {}).items()],
        kernels=kernels or [],
    )


def _by_key(rows: list[RowChange]) -> dict[tuple[str, str | None, str | None], RowChange]:
    return {(r.name, r.input_shapes, r.call_site): r for r in rows}


MM = ("aten::mm", "[[64, 64], [64, 64]]")


def test_the_same_operator_at_two_call_paths_is_kept_apart() -> None:
    # aten::mm, one shape, from two sites: only the loss's call got slower.
    base = _report({MM: (8, 800.0)}, {("aten::mm", SITE_A): (4, 400.0), ("aten::mm", SITE_B): (4, 400.0)})
    new = _report({MM: (8, 1200.0)}, {("aten::mm", SITE_A): (4, 400.0), ("aten::mm", SITE_B): (4, 800.0)})
    rows = _by_key(diff_reports(base, new).operators)
    assert set(rows) == {("aten::mm", None, SITE_A), ("aten::mm", None, SITE_B)}
    assert rows[("aten::mm", None, SITE_B)].change_us_per_step == 400.0 / STEPS
    assert rows[("aten::mm", None, SITE_A)].change_us_per_step == 0.0
    assert all(r.status == "changed" for r in rows.values())


def test_one_side_without_call_paths_still_matches_by_name_and_shapes() -> None:
    with_stacks = _report({MM: (8, 800.0), ("aten::add", "[[64], [64]]"): (8, 80.0)},
                          {("aten::mm", SITE_A): (4, 400.0), ("aten::mm", SITE_B): (4, 400.0)})
    without = _report({MM: (8, 900.0), ("aten::add", "[[64], [64]]"): (8, 80.0)})
    for base, new in ((with_stacks, without), (without, with_stacks)):
        rows = diff_reports(base, new).operators
        assert {r.status for r in rows} == {"changed"}, rows
        assert {(r.name, r.input_shapes, r.call_site) for r in rows} == {(*MM, None), ("aten::add", "[[64], [64]]", None)}
    # Nor when one side recorded no shapes (an older report): then operators match by name.
    no_shapes = _report({("aten::mm", None): (8, 800.0), ("aten::add", None): (8, 80.0)})
    rows = diff_reports(no_shapes, without).operators
    assert {(r.name, r.input_shapes, r.status) for r in rows} == {("aten::mm", None, "changed"), ("aten::add", None, "changed")}


def test_added_and_removed_operators_shapes_and_call_sites_are_listed() -> None:
    base = _report({MM: (8, 800.0), ("aten::relu", "[[64, 64]]"): (8, 40.0)},
                   {("aten::mm", SITE_A): (8, 800.0)})
    new = _report({MM: (12, 1200.0), ("aten::mm", "[[32, 64], [64, 64]]"): (4, 100.0), ("aten::gelu", "[[64, 64]]"): (8, 50.0)},
                  {("aten::mm", SITE_A): (8, 800.0), ("aten::mm", SITE_B): (8, 500.0)})
    rows = {(r.name, r.input_shapes, r.call_site): r.status for r in diff_reports(base, new).operators}
    assert rows == {
        ("aten::relu", "[[64, 64]]", None): "removed",
        ("aten::gelu", "[[64, 64]]", None): "added",
        ("aten::mm", None, SITE_A): "changed",
        # base lists every mm call under SITE_A, so SITE_B is new code calling mm
        ("aten::mm", None, SITE_B): "added",
    }


def test_a_site_missing_from_an_incomplete_list_is_not_called_added() -> None:
    # base lists only its top site (2 of 8 calls elsewhere): SITE_B may be among those, so its time in
    # new is compared with base's unlisted rest rather than called added.
    base = _report({MM: (8, 800.0)}, {("aten::mm", SITE_A): (6, 600.0)})
    new = _report({MM: (8, 800.0)}, {("aten::mm", SITE_A): (6, 600.0), ("aten::mm", SITE_B): (2, 200.0)})
    rows = _by_key(diff_reports(base, new).operators)
    assert {k: r.status for k, r in rows.items()} == {("aten::mm", None, SITE_A): "changed", ("aten::mm", None, OTHER_SITES): "changed"}
    other = rows[("aten::mm", None, OTHER_SITES)]
    assert other.base_us_per_step == other.new_us_per_step == 200.0 / STEPS
    assert other.base_calls_per_step == other.new_calls_per_step == 2 / STEPS


def test_an_operator_whose_sites_all_differ_is_compared_whole() -> None:
    # The script renamed (train_v1.py -> train_v2.py): no site in common, so the sites would list every
    # call as removed and added; the operator is matched by name and shapes instead.
    base = _report({MM: (8, 800.0)}, {("aten::mm", "<module> (train_v1.py:7)"): (8, 800.0)})
    new = _report({MM: (8, 400.0)}, {("aten::mm", "<module> (train_v2.py:7)"): (8, 400.0)})
    rows = _by_key(diff_reports(base, new).operators)
    assert list(rows) == [("aten::mm", MM[1], None)] and rows[("aten::mm", MM[1], None)].status == "changed"
    assert rows[("aten::mm", MM[1], None)].change_us_per_step == -400.0 / STEPS


def test_kernels_match_by_name_and_show_their_launcher() -> None:
    def kernel(name: str, us: float, by: str) -> KernelRow:
        return KernelRow(name=name, calls=4, total_us=us, mean_us=us / 4, min_us=us / 4, max_us=us / 4, launched_by=by)

    base = _report({MM: (8, 800.0)}, kernels=[kernel("sgemm_64x64", 400.0, "aten::mm"), kernel("relu_kernel", 40.0, "aten::relu")])
    # the majority launcher of sgemm changed: still the same kernel, not removed + added
    new = _report({MM: (8, 800.0)}, kernels=[kernel("sgemm_64x64", 600.0, "aten::addmm"), kernel("gelu_kernel", 40.0, "aten::gelu")])
    rows = {r.name: r for r in diff_reports(base, new).kernels}
    assert {n: r.status for n, r in rows.items()} == {"sgemm_64x64": "changed", "relu_kernel": "removed", "gelu_kernel": "added"}
    assert rows["sgemm_64x64"].change_us_per_step == 200.0 / STEPS and rows["gelu_kernel"].launched_by == "aten::gelu"


def test_call_sites_and_launchers_are_shown_and_escaped() -> None:
    from torchscope.render.diff_html import render_diff_html
    from torchscope.render.diff_terminal import render_diff_terminal

    hostile = "<script>alert(1)</script> (evil.py:1)"
    base = _report({MM: (8, 800.0)}, {("aten::mm", hostile): (8, 800.0)},
                   kernels=[KernelRow(name="sgemm", calls=4, total_us=40.0, mean_us=10.0, min_us=10.0, max_us=10.0, launched_by="aten::mm")])
    new = _report({MM: (8, 900.0)}, {("aten::mm", hostile): (8, 900.0)})
    diff = diff_reports(base, new)
    page = render_diff_html(diff)
    assert hostile not in page and "@ &lt;script&gt;alert(1)&lt;/script&gt; (evil.py:1)" in page and "by aten::mm" in page
    text = " ".join(render_diff_terminal(diff, width=200).split())
    assert f"aten::mm @ {hostile}" in text and "sgemm (by aten::mm)" in text


def test_the_html_diff_draws_side_by_side_breakdown_bars_to_one_scale() -> None:
    import re

    from torchscope.render.diff_html import render_diff_html
    from torchscope.report.model import CategoryTime

    base, new = _report({MM: (8, 800.0)}), _report({MM: (8, 800.0)})
    base.breakdown = {"data_loading": CategoryTime(us=400.0, percent=40.0), "forward": CategoryTime(us=300.0, percent=30.0)}
    new.breakdown = {"data_loading": CategoryTime(us=100.0, percent=12.5), "forward": CategoryTime(us=300.0, percent=37.5)}
    page = render_diff_html(diff_reports(base, new))
    bars = {m.group(1): re.findall(r"class='bar (base|new)' style='width:(\d+)px'", m.group(2))
            for m in re.finditer(r"<tr><td>(data_loading|forward)</td>(.*?)</tr>", page)}
    # One scale for both runs (the largest time is 200 px): base and new bars of a category side by side.
    assert bars == {"data_loading": [("base", "200"), ("new", "50")], "forward": [("base", "150"), ("new", "150")]}
    assert "-27.5 pp" in page
