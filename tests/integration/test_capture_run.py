"""`torchscope run` / `torchscope demo` on unmodified scripts, as subprocesses, compared with plain `python`.

Each case runs the same script under `python` and under `python -m torchscope run`, and checks that the
script cannot tell the difference (sys.argv, __name__, __file__, sys.path[0], __main__, stdout, exit code)
while torchscope found the steps and labelled the phases. Traces are checked by parsing their JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PHASES = {"torchscope:forward", "torchscope:backward", "torchscope:optimizer"}

# Prints what a script can observe about how it was started, trains 8 steps, then ends as $END says.
VIEW_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch

    view = {
        "argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
        "main_is_me": sys.modules["__main__"].__dict__ is globals(),
        "spec": __spec__.name if __spec__ else None,
    }
    print(json.dumps(view))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(8):
        opt.zero_grad()
        loss = model(torch.ones(4, 8) * i).pow(2).mean()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")
    print("to stderr", file=sys.stderr)
    end = os.environ.get("END", "")
    if end == "raise":
        raise ValueError("planted error")
    if end == "message":
        sys.exit("goodbye from the script")
    if end:
        sys.exit(int(end))
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, *args]
    return subprocess.run(command, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=180)


def torchscope(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "torchscope", *args], cwd, **env)


def only_run_dir(out: Path) -> Path:
    manifests = list(out.rglob("run*.json"))
    assert len(manifests) == 1, manifests
    return manifests[0].parent


def trace_events(run_dir: Path) -> list[dict[str, Any]]:
    traces = sorted(run_dir.glob("*.pt.trace.json"))
    assert len(traces) == 1, traces
    return json.loads(traces[0].read_text())["traceEvents"]


def step_numbers(events: list[dict[str, Any]]) -> list[int]:
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))


def user_annotations(events: list[dict[str, Any]]) -> set[str]:
    return {e["name"] for e in events if e.get("cat") == "user_annotation"}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "view.py").write_text(VIEW_SCRIPT)
    return tmp_path


# -- the script cannot tell the difference ------------------------------------------------------------


@pytest.mark.parametrize(("end", "exit_code", "status"), [("", 0, "complete"), ("raise", 1, "error")])
def test_script_sees_what_python_gives_it(workdir: Path, end: str, exit_code: int, status: str) -> None:
    args = ["scripts/view.py", "--out", "mine", "-m", "x", "--", "y"]  # flags named like ours stay the script's
    plain = _run(args, workdir, END=end)
    profiled = torchscope("run", "--no-report", "--out", "runs", *args, cwd=workdir, END=end)

    assert plain.returncode == exit_code
    assert profiled.returncode == exit_code, profiled.stderr
    assert profiled.stdout == plain.stdout  # byte for byte: the view, the loss, nothing of torchscope's
    view = json.loads(plain.stdout.splitlines()[0])
    assert view["argv"] == args and view["name"] == "__main__" and view["main_is_me"]
    assert view["path0"] == str((workdir / "scripts").resolve())
    # The script's own stderr (and, when it raised, Python's traceback) appear unchanged.
    assert "to stderr" in profiled.stderr
    if end == "raise":
        traceback = plain.stderr[plain.stderr.index("Traceback") :]
        assert traceback in profiled.stderr
    assert not any(line.startswith("torchscope: warning") for line in profiled.stderr.splitlines())

    run_dir = only_run_dir(workdir / "runs")
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == status and manifest["exit_code"] == exit_code
    assert manifest["command"] == args
    assert manifest["options"]["step_marking"] == "optimizer"
    assert manifest["steps_seen"] >= 5
    events = trace_events(run_dir)
    assert step_numbers(events) == [2, 3, 4]
    assert PHASES <= user_annotations(events)
    assert "torchscope: run directory: runs" in profiled.stderr.splitlines()


@pytest.mark.parametrize(("end", "exit_code"), [("3", 3), ("message", 1)])
def test_exit_code_follows_python_rules(workdir: Path, end: str, exit_code: int) -> None:
    # With the end-of-run report on: whether or not the analysis can report, the exit code is the script's.
    profiled = torchscope("run", "--out", "runs", "scripts/view.py", cwd=workdir, END=end)
    assert profiled.returncode == exit_code, profiled.stderr
    lines = profiled.stderr.splitlines()
    if end == "message":
        assert "goodbye from the script" in lines  # printed as Python prints sys.exit("...")
    assert sum(line.startswith("torchscope: warning") for line in lines) <= 1
    assert "Traceback" not in profiled.stderr
    assert any(line.startswith("torchscope: run directory: runs") for line in lines)
    manifest = json.loads((only_run_dir(workdir / "runs") / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["exit_code"] == exit_code


def test_module_target(workdir: Path) -> None:
    pkg = workdir / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(VIEW_SCRIPT)
    plain = _run(["-m", "mypkg.train", "a", "--b"], workdir)
    profiled = torchscope("run", "--no-report", "--out", "runs", "-m", "mypkg.train", "a", "--b", cwd=workdir)
    assert plain.returncode == profiled.returncode == 0, profiled.stderr
    assert profiled.stdout == plain.stdout
    view = json.loads(plain.stdout.splitlines()[0])
    assert view["argv"] == [str(pkg / "train.py"), "a", "--b"] and view["spec"] == "mypkg.train"
    assert view["path0"] == str(workdir)
    run_dir = only_run_dir(workdir / "runs")
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["command"] == ["-m", "mypkg.train", "a", "--b"]
    assert step_numbers(trace_events(run_dir)) == [2, 3, 4]


# -- step detection and capture options -------------------------------------------------------------------


def test_dataloader_fallback_without_an_optimizer(workdir: Path) -> None:
    (workdir / "infer.py").write_text(
        textwrap.dedent(
            """
            import torch
            data = torch.utils.data.TensorDataset(torch.randn(12 * 4, 8))
            model = torch.nn.Linear(8, 2)
            with torch.no_grad():
                for (x,) in torch.utils.data.DataLoader(data, batch_size=4):
                    model(x)
            print("inference done")
            """
        )
    )
    profiled = torchscope("run", "--no-report", "--active", "4", "--out", "runs", "infer.py", cwd=workdir)
    assert profiled.returncode == 0 and profiled.stdout == "inference done\n", profiled.stderr
    run_dir = only_run_dir(workdir / "runs")
    assert json.loads((run_dir / "run.json").read_text())["options"]["step_marking"] == "dataloader"
    events = trace_events(run_dir)
    assert step_numbers(events) == [2, 3, 4, 5]
    names = user_annotations(events)
    assert "torchscope:forward" in names
    assert any(n.startswith("enumerate(DataLoader)#") for n in names)


def test_module_view_of_an_unmodified_script(workdir: Path) -> None:
    """Under `torchscope run` each step starts in the model's forward pre-hook, inside its call: every
    recorded step's call counts once, with its children's time and without torchscope's own hook."""
    (workdir / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(128, 256), torch.randint(0, 8, (128,))
            for _ in range(8):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        )
    )
    profiled = torchscope("run", "--no-report", "--active", "4", "--out", "runs", "train.py", cwd=workdir)
    assert profiled.returncode == 0, profiled.stderr
    from torchscope import analyze

    rows = {row.path: row for row in analyze(only_run_dir(workdir / "runs"), use_cache=False).modules}
    top = rows["Sequential_0"]
    children = [row for path, row in rows.items() if path.startswith("Sequential_0/")]
    assert len(children) == 3 and all(row.calls == 4 for row in [top, *children])
    # Self time is host less the children's host per call, a call's negative remainder counted as 0 (a child's
    # frame outlasting its parent's by the tracer's clock): CI once read 36.6 us against 25.0 us a step.
    remainder = top.host_us_per_step - sum(c.host_us_per_step for c in children)
    assert remainder - 1e-6 <= top.host_self_us_per_step <= remainder + 0.02 * top.host_us_per_step
    # Sequential's own work is a loop over three children: far less than the step hook (~0.5-1 ms)
    assert 0 <= top.host_self_us_per_step < 0.1 * top.host_us_per_step


def test_an_evaluation_every_few_steps_stays_in_the_step_it_follows(workdir: Path) -> None:
    """The optimizer's step boundary waits for the next event with autograd on, so a validation loop under
    no_grad lies inside one step, and the diagnosis sees periodic work (2 of 8 recorded steps)."""
    (workdir / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(128, 256), torch.randint(0, 8, (128,))

            def evaluate():
                with torch.no_grad():
                    for _ in range(20):
                        model(torch.randn(128, 256))

            for step in range(16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step % 4 == 3:
                    evaluate()
            """
        )
    )
    profiled = torchscope("run", "--no-report", "--active", "8", "--out", "runs", "train.py", cwd=workdir)
    assert profiled.returncode == 0, profiled.stderr
    from torchscope import analyze

    report = analyze(only_run_dir(workdir / "runs"), use_cache=False)
    section = report.measurements.outside_steps
    assert section.culprit_steps_share.get("evaluate (train.py:7)") == 0.25, section
    # the whole evaluation inside its step: its model calls are no culprit of their own (the training
    # forward's call opens a few microseconds before its phase label, as the step starts in its pre-hook)
    calls = sum(us for name, us in section.culprits_us_per_step.items() if name.startswith("nn.Module"))
    assert calls < 0.01 * section.culprits_us_per_step["evaluate (train.py:7)"], section
    [finding] = [f for f in report.findings if f.id == "outside_steps.work"]
    assert "runs in 25.0% of the recorded steps" in finding.recommendation


def test_a_frozen_backbone_run_without_gradients_every_step_is_the_forward(workdir: Path) -> None:
    """A linear probe: a frozen backbone under no_grad, then a trainable head, every step. Once the run has
    trained the hooks give a call without gradients no label, and the backbone read as 56 % of the step of
    work outside the phases (critical, "run it every N steps"); run every step it is the forward. An
    evaluation every 4th step, also under no_grad and before the backward, stays outside the phases."""
    (workdir / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            backbone = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).eval()
            head = torch.nn.Linear(512, 8)
            opt = torch.optim.SGD(head.parameters(), lr=0.01)
            data = torch.utils.data.TensorDataset(torch.randn(2048, 256), torch.randint(0, 8, (2048,)))

            def evaluate():
                with torch.no_grad():
                    for _ in range(10):
                        head(backbone(torch.randn(128, 256)))

            for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=128)):
                if step % 4 == 0:
                    evaluate()
                with torch.no_grad():
                    features = backbone(x)
                for _ in range(10):  # augmentation between the backbone and the head: no forward
                    torch.sort(torch.randn(20000))
                loss = torch.nn.functional.cross_entropy(head(features), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        )
    )
    profiled = torchscope("run", "--no-report", "--active", "8", "--out", "runs", "train.py", cwd=workdir)
    assert profiled.returncode == 0, profiled.stderr
    from torchscope import analyze

    report = analyze(only_run_dir(workdir / "runs"), use_cache=False)
    section = report.measurements.outside_steps
    assert "nn.Module: Sequential_0" not in section.culprits_us_per_step, section
    assert section.culprit_steps_share.get("evaluate (train.py:8)") == 0.25, section
    evaluation = section.culprits_us_per_step["evaluate (train.py:8)"]
    # The backbone's call is a forward; the evaluation (10 backbone calls every 4th step) is not.
    assert report.phases["forward"].us > 0.5 * evaluation / 10 * 4, (report.phases, section)
    assert not any(f.id == "outside_steps.work" and "Sequential_0" in f.title for f in report.findings)
    # The backbone's call is not stretched to the next backward as the training forward is (to hold its loss).
    assert section.culprits_us_per_step.get("torch.sort", 0.0) > 0.25 * report.phases["other"].us, (report.phases, section)


def test_stop_after_active_ends_the_script_early(workdir: Path) -> None:
    (workdir / "long.py").write_text(
        textwrap.dedent(
            """
            import atexit, torch
            atexit.register(print, "atexit ran")
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.Adam(model.parameters())
            for i in range(100000):
                opt.zero_grad()
                model(torch.randn(8, 4)).sum().backward()
                opt.step()
            print("the whole training ran")
            """
        )
    )
    profiled = torchscope(
        "run", "--no-report", "--no-stack", "--no-memory", "--no-shapes", "--stop-after-active",
        "--out", "runs", "long.py", cwd=workdir,
    )
    assert profiled.returncode == 0, profiled.stderr
    assert profiled.stdout == "atexit ran\n"  # ended like sys.exit(0): atexit handlers still run
    run_dir = only_run_dir(workdir / "runs")
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "stopped" and manifest["steps_seen"] == 5
    assert manifest["options"] | {"step_marking": None} == {
        "record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": True,
        "phase_labels": True, "step_marking": None,
    }
    assert step_numbers(trace_events(run_dir)) == [2, 3, 4]
    # a capture ended on purpose once its window was saved is complete: the CPU's check at the end ran
    assert manifest["environment"]["cpu_peak"]["matmul_gflops"] > 0


def test_usage_errors_are_one_line(workdir: Path) -> None:
    nothing = torchscope("run", cwd=workdir)
    assert nothing.returncode == 2 and nothing.stderr.startswith("torchscope: error:")
    missing = torchscope("run", "--out", "runs", "missing.py", cwd=workdir)
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0
    assert "missing.py" in missing.stderr and not (workdir / "runs").exists()
    bad = torchscope("run", "--active", "0", "scripts/view.py", cwd=workdir)
    assert bad.returncode == 2


# -- the demo ---------------------------------------------------------------------------------------------


def test_demo_profiles_a_planted_data_loading_bottleneck(tmp_path: Path) -> None:
    demo = torchscope("demo", "--out", "demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "demo_train: 12 steps" in demo.stdout
    run_dir = tmp_path / "demo"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["options"]["step_marking"] == "optimizer"
    events = trace_events(run_dir)
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    loading = [e for e in events if e.get("name", "").startswith("enumerate(DataLoader)#_SingleProcess")]
    assert len(steps) == 3 and len(loading) == 3
    # The bottleneck is real: data loading is most of each step (computed here, not by torchscope).
    assert sum(e["dur"] for e in loading) / sum(e["dur"] for e in steps) > 0.5
    assert PHASES <= user_annotations(events)
    if importlib.util.find_spec("torchscope.render.json") is not None:
        report = json.loads((run_dir / "report.json").read_text())
        assert report["findings"][0]["category"] == "data_loading"
    assert f"torchscope: run directory: {run_dir.name}" in demo.stderr


def test_demo_that_cannot_capture_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the run directory should go")
    demo = torchscope("demo", "--out", str(blocker / "demo"), cwd=tmp_path)
    assert demo.returncode == 1
    assert demo.stderr.rstrip().splitlines()[-1] == "torchscope: error: the demo captured no trace (see the warning above)"
    assert "Traceback" not in demo.stderr
