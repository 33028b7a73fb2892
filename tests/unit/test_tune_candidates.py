"""pipeline/tune.py's decisions and the code change it shows (no trials: those are in
tests/integration/test_tune.py)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from types import SimpleNamespace

from torchscope.pipeline.tune import candidates_from, combine, loss_change, measure, run_noise_pct
from torchscope.pipeline.tune_snippets import code_change
from torchscope.render.tune_html import render_tune_html
from torchscope.render.tune_terminal import render_tune_terminal
from torchscope.report.model import Finding, Fix
from torchscope.report.tune import Candidate, TuneResult

FOREACH = Fix(kind="optimizer_kwarg", target="foreach", value=True)
FUSED = Fix(kind="optimizer_kwarg", target="fused", value=True)
WORKERS = Fix(kind="dataloader_kwarg", target="num_workers", value=2)
PERSISTENT = Fix(kind="dataloader_kwarg", target="persistent_workers", value=True)


def _finding(id: str, fixes: list[Fix], share: float) -> Finding:
    return Finding(id=id, category="other", severity="warning", title=id, evidence={}, time_share=share,
                   recommendation="", fixes=fixes)


def test_candidates_keep_a_findings_fixes_together_but_split_alternatives() -> None:
    findings = [
        _finding("data", [WORKERS, PERSISTENT, Fix(kind="code_change", target="torch.compile", value="x")], 0.5),
        _finding("opt", [FUSED, FOREACH], 0.2),
        _finding("again", [WORKERS, PERSISTENT], 0.1),  # the same fixes: no second trial
    ]
    candidates = candidates_from(SimpleNamespace(findings=findings))  # type: ignore[arg-type]  # only findings are read
    compiled = Fix(kind="code_change", target="torch.compile", value="x")  # a trial of its own
    assert [c.fixes for c in candidates] == [[WORKERS, PERSISTENT], [compiled], [FUSED], [FOREACH]]
    # A finding's cost is modelled for its first fix: the compile trial and the foreach alternative get none.
    assert [c.predicted_saving for c in candidates] == [0.5, None, 0.2, None]


def test_the_combination_keeps_one_of_two_alternatives_and_compounds_the_predictions() -> None:
    fast = Candidate(fix="a", description="", fixes=[WORKERS], speedup=2.0, predicted_saving=0.5)
    fused = Candidate(fix="b", description="", fixes=[FUSED], speedup=1.3, predicted_saving=0.2)
    foreach = Candidate(fix="c", description="", fixes=[FOREACH], speedup=1.2, predicted_saving=0.2)
    together = combine([fast, foreach, fused])
    assert set(together.fixes) == {WORKERS, FUSED}
    assert math.isclose(together.predicted_saving or 0, 1 - 0.5 * 0.8 * 0.8)


def test_a_speedup_is_reported_with_its_interval_only_beyond_noise() -> None:
    base = [[100.0, 102.0, 98.0], [101.0, 99.0, 100.0], [97.0, 99.5, 101.0]]
    halved = Candidate(fix="x", description="", fixes=[])
    measure(halved, base, [[50.0, 51.0, 49.0, 50.5, 49.5]])
    assert halved.status == "faster" and halved.significant
    assert halved.ci_low is not None and halved.ci_high is not None and halved.ci_low < 2.0 < halved.ci_high
    assert "over run means" in halved.detail and "df=2" in halved.detail
    same = Candidate(fix="y", description="", fixes=[])
    measure(same, base, [[101.0, 99.0, 100.5, 98.5, 102.0]])
    assert same.status == "no significant change" and not same.significant


def test_one_baseline_and_one_trial_fall_back_to_the_steps_with_the_floor() -> None:
    halved = Candidate(fix="x", description="", fixes=[])
    measure(halved, [[100.0, 102.0, 98.0, 101.0]], [[50.0, 51.0, 49.0]])
    assert halved.status == "faster" and "Welch" in halved.detail and "floor 2 %" in halved.detail


def test_the_noise_floor_is_the_baselines_spread_never_below_diffs_default() -> None:
    assert run_noise_pct([[100.0, 100.0], [110.0, 110.0]]) == 100.0 * statistics.stdev([100, 110]) / 105
    assert run_noise_pct([[100.0], [100.5]]) == 2.0
    assert run_noise_pct([[100.0]]) == 2.0


def test_loss_change_is_relative_and_a_diverged_trial_is_infinite() -> None:
    assert loss_change([2.0, 2.0], [2.2, 2.2, 9.0]) == 0.10000000000000009
    assert loss_change([2.0], [None]) == math.inf
    assert loss_change([None], [2.0]) is None  # the baseline diverged: nothing to hold the trial to
    assert loss_change([], [1.0]) is None


def test_the_code_change_rewrites_the_users_call_keeping_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nopt = torch.optim.Adam(\n    model.parameters(), lr=1e-3,\n    foreach=False)\n")
    lines = code_change([FUSED], {"optimizer_kwarg:fused": [f"{script}:2"]})
    assert lines == [f"--- {script}:2", "- opt = torch.optim.Adam(", "-     model.parameters(), lr=1e-3,",
                     "-     foreach=False)", "+ opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)"]
    assert code_change([WORKERS], {}) == ["+ DataLoader(..., num_workers=2)"]  # no known site: generic


def test_the_threads_change_edits_the_scripts_own_set_num_threads(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nif True:\n    torch.set_num_threads(os.cpu_count())  # all cores\n")
    threads = Fix(kind="torch_flag", target="torch.set_num_threads", value=1)
    sites = {"torch_flag:torch.set_num_threads": ["process-wide", f"{script}:3"]}
    assert code_change([threads], sites) == [f"--- {script}:3", "-     torch.set_num_threads(os.cpu_count())  # all cores",
                                             "+     torch.set_num_threads(1)  # all cores"]
    assert code_change([threads], {"torch_flag:torch.set_num_threads": ["process-wide"]}) == ["+ torch.set_num_threads(1)"]


def test_renderers_escape_user_text() -> None:
    candidate = Candidate(fix="num_workers=2", description="data: <b>\x1b[31m", fixes=[WORKERS], status="faster",
                          speedup=2.0, ci_low=1.5, ci_high=2.6, predicted_saving=0.4, measured_saving=0.5,
                          change=["+ DataLoader(<x>)"])
    result = TuneResult(command=["<script>.py"], baseline_step_us=1000.0, baseline_steps=5, noise_pct=2.0, candidates=[candidate],
                        trials=2, elapsed_s=3.0, verdict="best: num_workers=2 (2.00x)")
    page = render_tune_html(result)
    assert "<script>" not in page and "&lt;script&gt;.py" in page and "\x1b" not in page
    text = render_tune_terminal(result)
    assert "\x1b" not in text and "predicted 40 %, measured 50 %" in text and "2.00x (95 % CI 1.50-2.60x)" in text
    candidate.compile_s = 12.5
    assert "compile 12.5 s (not in the step times)" in render_tune_terminal(result)
    assert "compile 12.5 s (not in the step times)" in render_tune_html(result)


def test_try_parses_one_candidate_and_rejects_what_a_trial_cannot_apply() -> None:
    import pytest

    from torchscope.errors import UsageError
    from torchscope.pipeline.tune import parse_try, requested

    assert parse_try("num_workers=4, persistent_workers=True") == (
        Fix(kind="dataloader_kwarg", target="num_workers", value=4),
        Fix(kind="dataloader_kwarg", target="persistent_workers", value=True))
    assert parse_try("channels_last")[0].target == "channels_last"
    assert parse_try("set_num_threads=1") == (Fix(kind="torch_flag", target="torch.set_num_threads", value=1),)
    for bad in ("num_workers", "batch_size=64", "torch.compile()=1"):
        with pytest.raises(UsageError):
            parse_try(bad)
    proposed = [Candidate(fix="num_workers=2", description="", fixes=[WORKERS])]
    extra = requested([(WORKERS,), (FOREACH,)], proposed)  # the diagnosis's own candidate is not repeated
    assert [c.fixes for c in extra] == [[FOREACH]] and extra[0].finding is None


def test_the_autocast_change_wraps_the_line_that_calls_the_model(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("for x in data:\n    loss = model(x).sum()\n")
    fix = Fix(kind="code_change", target="torch.autocast", value="torch.autocast('cpu', dtype=torch.bfloat16)")
    assert code_change([fix], {"code_change:torch.autocast": [f"{script}:2"]}) == [
        f"--- {script}:2", "-     loss = model(x).sum()", "+     with torch.autocast('cpu', dtype=torch.bfloat16):",
        "+         loss = model(x).sum()"]


def test_the_compile_change_follows_the_models_construction_and_is_a_candidate_of_its_own(tmp_path: Path) -> None:
    from torchscope.pipeline.tune import candidates_from, parse_try

    script = tmp_path / "train.py"
    script.write_text("model = Net(\n    4)\nfor x in data:\n    loss = criterion(model(x), y)\n")
    fix = parse_try("torch.compile")[0]
    assert fix == Fix(kind="code_change", target="torch.compile", value="model = torch.compile(model)")
    assert code_change([fix], {"code_change:torch.compile": [f"{script}:4"]}) == [
        f"--- {script}:1", "  model = Net(", "      4)", "+ model = torch.compile(model)"]
    assert code_change([fix], {})[0].startswith("+ model = torch.compile(model)")
    autocast = Fix(kind="code_change", target="torch.autocast", value="bfloat16")
    report = SimpleNamespace(findings=[_finding("compute", [autocast, fix], 0.5)])
    assert [c.fixes for c in candidates_from(report)] == [[autocast], [fix]]  # type: ignore[arg-type]


class _FakeTrials:
    """Stands in for pipeline.tune._Trials: each trial's steps (or failure text) from a table by fix."""

    def __init__(self, steps: dict[str, object], budget_after: int = 99) -> None:
        self.steps, self.count, self.budget_after = steps, 0, budget_after
        self.limits: list[float] = []
        self.findings: list[Finding] = []

    def run(self, fixes: list[Fix], limit_s: float) -> object:
        from torchscope.capture.trial import TrialRecord
        from torchscope.pipeline.tune import _Trial

        self.count += 1
        self.limits.append(limit_s)
        outcome = self.steps[",".join(f.target for f in fixes) or "base"]
        if isinstance(outcome, str):
            return outcome
        sites = {f"{f.kind}:{f.target}": ["train.py:3"] for f in fixes}
        report = SimpleNamespace(steps=outcome, findings=[] if fixes else self.findings,
                                 device=SimpleNamespace(present=False))  # a CPU machine
        return _Trial(report, TrialRecord(sites=sites, losses=[1.0]),  # type: ignore[arg-type]
                      10.0, Path("unused"))

    def left_s(self) -> float:
        return 100.0 if self.count < self.budget_after else 0.0


def _steps(mean: float) -> list[SimpleNamespace]:
    return [SimpleNamespace(span=0, step=i, duration_us=mean * (1 + 0.01 * (i % 3))) for i in range(5)]


def _orchestrate(monkeypatch: object, steps: dict[str, object], budget_after: int = 99,
                 extra: tuple[tuple[Fix, ...], ...] = (), only: bool = False) -> tuple[TuneResult, _FakeTrials]:
    import torchscope.pipeline.tune as tune_module

    fake = _FakeTrials(steps, budget_after)
    fake.options = tune_module.TuneOptions(baselines=1)  # type: ignore[attr-defined]
    findings = [_finding("data", [WORKERS], 0.5), _finding("opt", [FOREACH], 0.2), _finding("flag", [THREADS], 0.1)]
    fake.findings = findings  # the baseline's diagnosis
    monkeypatch.setattr(tune_module, "_Trials", lambda *a: fake)  # type: ignore[attr-defined]
    return tune_module.tune(["train.py"], tune_module.TuneOptions(baselines=1, extra=extra, only=only)), fake


THREADS = Fix(kind="torch_flag", target="torch.set_num_threads", value=1)


def test_the_faster_candidates_are_combined_and_re_measured_a_failure_and_an_early_stop_reported(monkeypatch: object) -> None:
    result, fake = _orchestrate(monkeypatch, {
        "base": _steps(100.0), "num_workers": _steps(50.0), "foreach": _steps(80.0),
        "torch.set_num_threads": "stopped after 30 s", "foreach,num_workers": _steps(40.0),
    })
    by_fix = {c.fix: c for c in result.candidates}
    assert by_fix["num_workers=2"].status == "faster" and by_fix["foreach=True"].status == "faster"
    assert by_fix["torch.set_num_threads=1"].status == "slower"  # still running at 3x the baseline's 10 s
    assert "stopped early" in by_fix["torch.set_num_threads=1"].detail and fake.limits[1:] == [30.0] * 4
    assert result.combination is not None and result.combination.status == "faster"
    assert result.best == result.combination.fix and result.trials == 5
    assert result.combination.predicted_saving is not None and abs(result.combination.predicted_saving - 0.6) < 1e-9


def test_no_trial_starts_once_the_budget_is_spent(monkeypatch: object) -> None:
    result, fake = _orchestrate(monkeypatch, {"base": _steps(100.0), "num_workers": _steps(100.0)}, budget_after=2)
    assert [c.status for c in result.candidates] == ["no significant change", "skipped", "skipped"]
    assert result.candidates[1].detail == "not run: the time budget was spent" and fake.count == 2  # nor a repeat
    assert result.verdict == "no candidate beats the baseline beyond noise"


def test_cuda_only_candidates_are_proposed_from_a_gpu_trace_and_skipped_on_a_cpu_machine(
        monkeypatch: object, real_traces: object) -> None:
    from torchscope.capture.interventions import needs_cuda
    from torchscope.pipeline.analyze import analyze
    from torchscope.pipeline.tune import parse_try

    # (a) The V100 ResNet-50 trace (FP32, pageable copies): the diagnosis proposes TF32 and pin_memory.
    gpu = analyze(real_traces.folder("resnet50_num_workers_0"), jobs=1)  # type: ignore[attr-defined]
    proposed = [f for c in candidates_from(gpu) for f in c.fixes if needs_cuda(f)]
    assert gpu.device.present and {f.target for f in proposed} >= {"torch.backends.cuda.matmul.allow_tf32", "pin_memory"}
    # (c) Asked for on a machine whose baseline has no device: skipped, said why, no trial run.
    cuda_only = (parse_try("pin_memory=True"), parse_try("torch.backends.cudnn.benchmark=True"),
                 parse_try("torch.backends.cuda.matmul.allow_tf32=True"))
    result, fake = _orchestrate(monkeypatch, {"base": _steps(100.0), "num_workers": _steps(100.0), "foreach": _steps(100.0),
                                              "torch.set_num_threads": _steps(100.0)}, extra=cuda_only)
    skipped = [c for c in result.candidates if c.finding is None]
    assert len(skipped) == 3 and all(c.status == "skipped" and "needs a CUDA device" in c.detail for c in skipped)
    assert fake.count == 1 + 3 * 2  # the baseline, and two trials each for the three CPU candidates only


def test_only_runs_the_asked_candidates_and_lists_the_diagnosis_others_as_skipped(monkeypatch: object) -> None:
    result, fake = _orchestrate(monkeypatch, {"base": _steps(100.0), "foreach": _steps(60.0)}, extra=((FOREACH,),), only=True)
    by_fix = {c.fix: c for c in result.candidates}
    assert by_fix["foreach=True"].status == "faster" and by_fix["foreach=True"].finding == "opt"  # the diagnosis's own
    assert [c.status for c in result.candidates if c.fix != "foreach=True"] == ["skipped", "skipped"]
    assert by_fix["num_workers=2"].detail == "not run: --only (the --try candidates alone)" and fake.count == 2


def test_two_winning_alternatives_are_not_combined_into_a_trial_of_one_of_them(monkeypatch: object) -> None:
    """foreach and fused both faster: their combination would be the faster one alone (they exclude each
    other), already measured: no combination trial (it cost a 10-50 s trial of adam_foreach_false)."""
    result, fake = _orchestrate(monkeypatch, {"base": _steps(100.0), "foreach": _steps(70.0), "fused": _steps(40.0)},
                                extra=((FOREACH,), (FUSED,)), only=True)
    by_fix = {c.fix: c for c in result.candidates}
    assert by_fix["foreach=True"].status == "faster" and by_fix["fused=True"].status == "faster"
    assert result.combination is None and result.best == "fused=True" and fake.count == 3
