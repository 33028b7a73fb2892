"""In-code capture (`torchscope.profile()`), real CPU profiling in this process, plus the capture's pure
logic (step detection, run-directory choice, trace writer, manifest).

Trace files are checked by parsing their JSON directly, independently of torchscope's loader.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

import torchscope  # noqa: E402
from torchscope.capture.phases import BACKWARD, FORWARD, OPTIMIZER, PhaseHooks  # noqa: E402
from torchscope.capture.profiler import CaptureComplete, Profiler  # noqa: E402
from torchscope.capture.rundir import DistEnv, choose_run_dir, dist_env_from, launch_tag, worker_name  # noqa: E402
from torchscope.capture.steps import StepDetector  # noqa: E402
from torchscope.capture.tracewriter import TraceWriter  # noqa: E402
from torchscope.cli.run import add_capture_options, config_from_args  # noqa: E402
from torchscope.errors import CaptureError  # noqa: E402
from torchscope.rundir.config import CaptureConfig  # noqa: E402
from torchscope.rundir.layout import LAUNCH_MARKER, manifest_name  # noqa: E402
from torchscope.rundir.manifest import Manifest, read_manifests, write_manifest  # noqa: E402

MANIFEST_FIELDS = {
    "schema_version", "torchscope_version", "torch_version", "python_version", "command", "cwd", "host", "pid",
    "rank", "world_size", "local_rank", "start_time", "end_time", "schedule", "activities", "options",
    "trace_files", "steps_seen", "status", "errors",
}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


# -- helpers ------------------------------------------------------------------------------------------


def load_events(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["traceEvents"]


def step_numbers(events: list[dict[str, Any]]) -> list[int]:
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))


def train(steps: int, prof: Profiler | None = None, fail_at: int | None = None) -> torch.nn.Module:
    """A tiny deterministic training loop (DataLoader, forward, backward, optimizer)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 8, 16), torch.randn(steps * 8, 1))
    for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8)):
        if i == fail_at:
            raise RuntimeError("planted failure")
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if prof is not None:
            prof.step()
    return model


def global_hook_state() -> tuple[Any, ...]:
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module
    from torch.utils.data import dataloader

    return (
        len(nn_module._global_forward_pre_hooks),
        len(nn_module._global_forward_hooks),
        len(optim_module._global_optimizer_pre_hooks),
        len(optim_module._global_optimizer_post_hooks),
        torch.Tensor.backward,
        torch.autograd.backward,
        dataloader._BaseDataLoaderIter.__next__,
    )


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Profiler:
    out = tmp_path_factory.mktemp("capture") / "run"
    with torchscope.profile(out=out) as prof:
        train(8, prof)
    return prof


# -- in-code capture ------------------------------------------------------------------------------------


def test_out_that_does_not_exist_becomes_the_run_directory(captured: Profiler) -> None:
    assert captured.run_dir is not None and captured.run_dir.name == "run"
    assert sorted(p.name for p in captured.run_dir.iterdir()) == sorted(
        ["run.json", *(p.name for p in captured.trace_files)]
    )


def test_trace_file_is_tensorboard_layout_and_valid_json(captured: Profiler) -> None:
    assert len(captured.trace_files) == 1
    trace = captured.trace_files[0]
    assert re.fullmatch(r".+_\d+\.\d{13}\.pt\.trace\.json", trace.name)
    assert trace.name.startswith(worker_name(DistEnv()))
    events = load_events(trace)
    assert step_numbers(events) == [2, 3, 4]  # wait=1, warmup=1, active=3


def test_phase_labels_are_user_annotations_nested_in_steps(captured: Profiler) -> None:
    events = load_events(captured.trace_files[0])
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    labels = [e for e in events if e.get("name") in (FORWARD, BACKWARD, OPTIMIZER)]
    assert {e["name"] for e in labels} == {FORWARD, BACKWARD, OPTIMIZER}
    assert all(e["cat"] == "user_annotation" for e in labels)
    for name in (FORWARD, BACKWARD, OPTIMIZER):  # one per step
        assert sum(e["name"] == name for e in labels) == 3
    for label in labels:
        assert any(
            s["ts"] <= label["ts"] and label["ts"] + label["dur"] <= s["ts"] + s["dur"] for s in steps
        ), f"{label['name']} at {label['ts']} is not inside one ProfilerStep"
    # Phases never overlap one another, and run in training order within a step.
    ordered = sorted(labels, key=lambda e: e["ts"])
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert a["ts"] + a["dur"] <= b["ts"]
    assert [e["name"] for e in ordered[:3]] == [FORWARD, BACKWARD, OPTIMIZER]


def test_manifest_fields(captured: Profiler) -> None:
    assert captured.run_dir is not None
    manifest = json.loads((captured.run_dir / "run.json").read_text())
    assert MANIFEST_FIELDS <= manifest.keys()
    assert manifest["schema_version"] == 1
    assert manifest["torch_version"] == torch.__version__
    assert manifest["torchscope_version"] == torchscope.__version__
    assert (manifest["rank"], manifest["world_size"], manifest["local_rank"]) == (0, 1, 0)
    assert manifest["schedule"] == {"skip_first": 0, "wait": 1, "warmup": 1, "active": 3, "repeat": 1}
    assert manifest["activities"] == ["cpu"]
    assert manifest["options"] == {
        "record_shapes": True, "profile_memory": True, "with_stack": True, "with_flops": True,
        "phase_labels": True, "step_marking": "manual",
    }
    assert manifest["trace_files"] == [p.name for p in captured.trace_files]
    assert manifest["steps_seen"] == 8
    assert manifest["status"] == "complete" and manifest["errors"] == []
    assert manifest["command"] == sys.argv
    assert ISO_UTC.match(manifest["start_time"]) and ISO_UTC.match(manifest["end_time"])
    assert manifest["start_time"] <= manifest["end_time"]


def test_profiling_does_not_change_training_results(tmp_path: Path) -> None:
    plain = train(8)
    with torchscope.profile(out=tmp_path / "r") as prof:
        profiled = train(8, prof)
    for a, b in zip(plain.parameters(), profiled.parameters(), strict=True):
        assert torch.equal(a, b)


def test_hooks_are_removed_on_exit_even_after_an_exception(tmp_path: Path) -> None:
    before = global_hook_state()
    with pytest.raises(RuntimeError, match="planted failure"):
        with torchscope.profile(out=tmp_path / "r") as prof:
            assert global_hook_state() != before
            train(8, prof, fail_at=3)
    assert global_hook_state() == before
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert manifest["status"] == "error"
    assert len(prof.trace_files) == 1  # step 2 was recording: its partial window is saved
    assert step_numbers(load_events(prof.trace_files[0])) == [2, 3]


def test_hooks_retire_once_the_capture_is_complete(tmp_path: Path) -> None:
    from torchscope.capture.overhead import REFERENCE_STEPS

    before = global_hook_state()
    with torchscope.profile(out=tmp_path / "r") as prof:
        train(4, prof)
        assert global_hook_state() != before  # still capturing after 4 steps
        train(1, prof)
        # Window saved at step 5; the hooks stay while the step clock times its unprofiled reference steps
        # (the profiler's own cost, issue 13), then retire: no cost for the rest of the run.
        assert global_hook_state() != before
        train(REFERENCE_STEPS + 1, prof)  # retired at the first boundary after the last reference step
        assert global_hook_state() == before
    assert prof.steps_seen == 6 + REFERENCE_STEPS and len(prof.trace_files) == 1


def test_existing_out_gets_a_new_folder_per_run(tmp_path: Path) -> None:
    dirs = []
    for _ in range(2):
        with torchscope.profile(out=tmp_path, name="exp") as prof:
            train(6, prof)
        dirs.append(prof.run_dir)
    assert dirs[0] != dirs[1]
    for d in dirs:
        assert d is not None and d.parent == tmp_path
        assert re.fullmatch(r"exp-\d{8}-\d{6}(-\d+)?", d.name)
        assert (d / "run.json").exists()


def test_repeat_writes_one_trace_per_cycle(tmp_path: Path) -> None:
    # torch warns once per process, at a second cycle, that each cycle's events are cleared (set
    # acc_events=True): wrong advice for torchscope, which wants one trace per cycle; not shown.
    shown = getattr(torch.profiler.profiler, "_WARNINGS_SHOWN", set())
    shown.difference_update({m for m in shown if "clears events" in m})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        with torchscope.profile(out=tmp_path / "r", wait=0, warmup=1, active=2, repeat=2) as prof:
            train(8, prof)
        assert warnings.filters == before  # only our entry was removed, the test's own stay
    assert not [w for w in caught if "clears events" in str(w.message)]
    assert len(prof.trace_files) == 2
    assert [step_numbers(load_events(p)) for p in prof.trace_files] == [[1, 2], [4, 5]]


def test_interrupt_mid_window_saves_a_partial_trace(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with torchscope.profile(out=tmp_path / "r", active=10) as prof:
            for i, _ in enumerate(iter(int, 1)):
                train(1)
                prof.step()
                if i == 4:
                    raise KeyboardInterrupt
    assert len(prof.trace_files) == 1
    assert step_numbers(load_events(prof.trace_files[0])) == [2, 3, 4, 5]
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "interrupted"


def test_stop_after_active_raises_capture_complete(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        with torchscope.profile(out=tmp_path / "r", stop_after_active=True) as prof:
            train(20, prof)
    assert isinstance(info.value, CaptureComplete) and info.value.code == 0
    assert prof.steps_seen == 5
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "stopped"


def test_too_few_steps_is_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with torchscope.profile(out=tmp_path / "r") as prof:
        train(1, prof)
    assert prof.trace_files == []
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert manifest["errors"] and "no trace was written" in manifest["errors"][0]
    assert capsys.readouterr().err.count("torchscope: warning:") == 1


def test_profiler_that_fails_to_start_leaves_training_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken_start(self: Any) -> None:
        raise RuntimeError("Kineto is broken")

    monkeypatch.setattr(torch.profiler.profile, "start", broken_start)
    before = global_hook_state()
    with torchscope.profile(out=tmp_path / "r") as prof:
        assert global_hook_state() == before  # nothing installed when the profiler is off
        model = train(8, prof)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), train(8).parameters(), strict=True))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("torchscope:")]
    assert len(warnings) == 1 and "failed to start" in warnings[0] and "Kineto is broken" in warnings[0]
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert manifest["trace_files"] == [] and "Kineto is broken" in manifest["errors"][0]


def test_invalid_schedule_is_a_capture_error() -> None:
    with pytest.raises(CaptureError, match="active must be >= 1"):
        Profiler(active=0)


def test_capture_defaults_agree_everywhere() -> None:
    """`torchscope.profile()`'s keywords, `torchscope run`'s options and CaptureConfig() have one set of defaults."""
    config = CaptureConfig()
    keywords = inspect.signature(Profiler).parameters
    assert {f.name: keywords[f.name].default for f in msgspec.structs.fields(CaptureConfig)} == msgspec.structs.asdict(config)
    parser = argparse.ArgumentParser()
    add_capture_options(parser)
    assert config_from_args(parser.parse_args([])) == config
    assert Profiler().config == config


# -- phase hooks ------------------------------------------------------------------------------------------


def test_phase_hooks_report_boundaries_and_nest_phases() -> None:
    events: list[str] = []
    hooks = PhaseHooks(
        labels=False, on_boundary=lambda kind, key, grad: events.append(kind), on_optimizer_step=lambda o: events.append("step")
    )
    hooks.install()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for (x,) in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4)), batch_size=2):
            loss = model(x).sum()  # nested Linear calls are inside the one forward phase
            assert hooks.active_phase is None
            loss.backward()
            opt.step()
    finally:
        hooks.uninstall()
    assert events == ["data", "forward", "backward", "step"] * 2 + ["data"]


def test_forward_phase_survives_an_exception_in_a_module() -> None:
    class Boom(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("boom")

    hooks = PhaseHooks(labels=True)
    hooks.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), Boom())
        with pytest.raises(ValueError):
            model(torch.zeros(1, 2))
        assert hooks.active_phase is None  # always_call post hooks closed it
        torch.nn.Linear(2, 2)(torch.zeros(1, 2))
        assert hooks.active_phase is None
    finally:
        hooks.uninstall()


# -- step detection (pure logic) -------------------------------------------------------------------------


class _Counter:
    def __init__(self) -> None:
        self.steps = 0

    def __call__(self) -> None:
        self.steps += 1


def _drive(detector: StepDetector, script: list[Any]) -> None:
    for event in script:
        if isinstance(event, str):
            detector.on_boundary(event)
        else:
            detector.on_optimizer_step(event)


def test_steps_follow_the_first_optimizer_only() -> None:
    counter = _Counter()
    detector = StepDetector(counter)
    gen, disc = object(), object()
    iteration = ["data", "forward", "backward", disc, "forward", "backward", gen]  # a GAN iteration
    _drive(detector, iteration * 4)
    # disc steps first, so it is the step source; its boundary lands at the next top-level event (the
    # generator's forward): every step still spans exactly one full iteration.
    assert detector.source == "optimizer"
    assert counter.steps == 4


def test_steps_fall_back_to_dataloader_fetches() -> None:
    counter = _Counter()
    detector = StepDetector(counter)
    _drive(detector, ["data", "forward"] * 5)
    assert detector.source == "dataloader" and counter.steps == 4


def test_gradient_accumulation_switches_to_the_optimizer() -> None:
    counter = _Counter()
    detector = StepDetector(counter)
    opt = object()
    micro = ["data", "forward", "backward"]
    _drive(detector, (micro * 4 + [opt]) * 3)
    # 3 DataLoader steps before the optimizer first stepped, then one per optimizer step.
    assert detector.source == "optimizer" and counter.steps == 3 + 2


def test_back_to_back_steps_of_the_source_optimizer_each_count() -> None:
    counter = _Counter()
    detector = StepDetector(counter)
    opt = object()
    _drive(detector, [opt, opt, opt])  # LBFGS-style: forward/backward inside step()
    assert counter.steps == 2


# -- run directory, trace writer, manifest --------------------------------------------------------------


def test_exclusive_run_folders_get_a_suffix_in_the_same_second(tmp_path: Path) -> None:
    env = DistEnv()
    first = choose_run_dir(tmp_path, "train", env, now=0.0)
    second = choose_run_dir(tmp_path, "train", env, now=0.0)
    assert first != second and second.name == first.name + "-1"


def test_run_name_cannot_escape_the_output_folder(tmp_path: Path) -> None:
    run_dir = choose_run_dir(tmp_path, "../../etc/x y", DistEnv(), now=0.0)
    assert run_dir.parent == tmp_path and "/" not in run_dir.name


def test_ranks_of_one_launch_agree_on_one_folder(tmp_path: Path) -> None:
    environ = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc123"}
    rank0 = dist_env_from({**environ, "RANK": "0", "LOCAL_RANK": "0"}, parent_pid=4242)
    rank1 = dist_env_from({**environ, "RANK": "1", "LOCAL_RANK": "1"}, parent_pid=4242)
    assert launch_tag(rank0) == launch_tag(rank1)
    out = tmp_path / "out"
    assert choose_run_dir(out, "train", rank0) == out == choose_run_dir(out, "train", rank1)
    assert (out / LAUNCH_MARKER).exists()
    # The next launch finds `out` taken and makes one shared folder inside it.
    nxt = dist_env_from({**environ, "TORCHELASTIC_RUN_ID": "def456", "RANK": "1"}, parent_pid=4343)
    joined = choose_run_dir(out, "train", nxt)
    assert joined.parent == out and joined == choose_run_dir(out, "train", nxt)
    assert [manifest_name(env.rank, env.distributed) for env in (rank0, rank1)] == ["run.rank0.json", "run.rank1.json"]
    assert worker_name(rank1, host="h") == "h_rank1"


def test_no_run_directory_is_a_capture_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CaptureError, match="cannot create a run directory"):
        choose_run_dir(blocker / "sub", "train", DistEnv())


def test_trace_writer_reports_instead_of_raising(tmp_path: Path) -> None:
    class FullDisk:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text("{")  # half written, then the disk is full
            raise OSError(28, "No space left on device")

    problems: list[str] = []
    writer = TraceWriter(tmp_path, "host_1", problems.append)
    writer(FullDisk())
    assert writer.files == [] and list(tmp_path.iterdir()) == []
    assert len(problems) == 1 and "No space left on device" in problems[0]


def test_manifest_write_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_manifest(path, Manifest(schema_version=1))
    write_manifest(path, Manifest(schema_version=1, status="complete"))
    assert json.loads(path.read_text()) == {"schema_version": 1, "status": "complete"}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_captured_manifest_reads_back_whole(captured: Profiler) -> None:
    assert captured.run_dir is not None
    written = json.loads((captured.run_dir / "run.json").read_text())
    [manifest] = read_manifests(captured.run_dir)
    # Every field in the declared order; only fields whose default is UNSET (e.g. `backend` outside
    # torch.distributed) may be left out.
    optional = {f.name for f in msgspec.structs.fields(Manifest) if f.default is msgspec.UNSET}
    assert list(written) == [name for name in Manifest.__struct_fields__ if name in written]
    assert set(Manifest.__struct_fields__) - set(written) <= optional
    assert msgspec.to_builtins(manifest) == written



def _validate_every_step(prof: Profiler, steps: int, train_first: bool = True) -> None:
    """Training steps, each followed by a validation pass under no_grad (or, without `train_first`, an
    inference loop: no backward ever)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    held_out = torch.randn(256, 16)
    for _ in range(steps):
        if train_first:
            opt.zero_grad()
            model(torch.randn(8, 16)).square().mean().backward()
            opt.step()
        with torch.no_grad():
            model(held_out)
        prof.step()


def test_a_model_call_without_gradients_after_training_is_not_the_forward_phase(tmp_path: Path) -> None:
    with torchscope.profile(out=tmp_path / "r", wait=1, warmup=1, active=3) as prof:
        _validate_every_step(prof, 6)
    events = load_events(prof.trace_files[0])
    forwards = [e for e in events if e.get("name") == FORWARD]
    assert len(forwards) == 3  # the training forward of each recorded step, not the validation
    validation = [e for e in events if e.get("name") == "nn.Module: Sequential_0"]
    assert len(validation) == 6  # both calls of each step are recorded
    # The forward label opens inside the module call's hook: a training call overlaps a label, a validation one none.
    labelled = [v for v in validation if any(f["ts"] < v["ts"] + v["dur"] and v["ts"] < f["ts"] + f["dur"] for f in forwards)]
    assert len(labelled) == 3
    # The analysis sees the validation as the step's work outside the phases, named after the model.
    report = torchscope.analyze(tmp_path / "r", jobs=1, use_cache=False)
    assert next(iter(report.measurements.outside_steps.culprits_us_per_step)) == "nn.Module: Sequential_0"
    # An inference loop (no backward ever) under no_grad: its model calls are the forward phase.
    with torchscope.profile(out=tmp_path / "inference", wait=1, warmup=1, active=3) as prof:
        _validate_every_step(prof, 6, train_first=False)
    assert sum(e.get("name") == FORWARD for e in load_events(prof.trace_files[0])) == 3
