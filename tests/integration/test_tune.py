"""`torchscope tune` on real CPU training runs: each finding's fix applied without editing the code, in
its own trial process, measured against the baseline. Trials are kept short (few steps, one baseline
where the noise estimate is not the point); the tests that assert a speed-up or its absence need three or
four baselines (the run is the noise model's unit): the whole file took 5 min at load 3.5 on the shared
2-core VM (fused 91 s, healthy 66 s, torch.compile 49 s, num_workers 46 s, the others 11-21 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from helpers.signals import default_signals

from torchscope.pipeline.analyze import analyze

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "bottlenecks"

# A slow __getitem__ read with num_workers=0, and a checkpoint plus a log line written by relative path
# (into the working directory) after every step: the trials must leave that directory as it was.
CHECKPOINTING = """
import os, time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self): return 1024
    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.ones(16) * (i % 7), i % 3

model = torch.nn.Linear(16, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=16)):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    torch.save(model.state_dict(), f"checkpoint{step}.pt")
    with open("train.log", "a") as log:
        log.write(f"{step} {loss.item()} trial={os.environ.get('TORCHSCOPE_TRIAL')}\\n")
    if step == 40:
        break
"""

# Compute-bound with nothing a setting can speed up on this CPU: two bias-free 1024x1024 layers (a
# matmul each in forward, two each in backward) and an elementwise loss, no activation to fuse.
MATMULS = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.Linear(1024, 1024, bias=False))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
data = torch.randn(128, 1024)
for _ in range(8):
    loss = model(data).square().mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
"""

# A small model called beside a parameterless loss module: torch.compile is the candidate.
COMPILED = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
criterion = torch.nn.MSELoss()
x, y = torch.randn(16, 32), torch.randn(16, 1)
for _ in range(6):
    loss = criterion(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
"""


def _tune(target: str, cwd: Path, *options: str, env: Optional[dict[str, str]] = None) -> dict:  # type: ignore[type-arg]
    """`options` end with `-m` for a module target."""
    done = subprocess.run([sys.executable, "-m", "torchscope", "tune", "--format", "json", *options, target],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_more_dataloader_workers_are_measured_faster_and_the_change_points_at_the_call(tmp_path: Path) -> None:
    """num_workers=4 on the planted slow __getitem__ (time.sleep: the loading waits, so the workers need
    no cores of their own). The diagnosis's own advice depends on how busy the cores are (it may propose
    fewer workers, or none, on a loaded 2-core machine): `--try` makes sure this candidate is measured;
    where the diagnosis proposed the same, it is one candidate; `--only`: its other candidates are listed, not run.
    Three baselines (the default): runs are the unit of the noise model, and with one baseline and the
    trial's two runs its t has one degree of freedom (12.7 at 95 %). Four workers, not two: two measured
    1.44-1.84x, within noise where the baselines spread 16 % (load 1.5-3.8); four measured 2.53x and 2.93x
    (intervals from 1.79 and 2.25) at load 1.5, so the >= 1.5x the issue asks for has a margin."""
    script = EXAMPLES / "slow_getitem.py"
    result = _tune(str(script), tmp_path, "--active", "7", "--only", "--try", "num_workers=4")  # all 10 steps
    data = next(c for c in result["candidates"]
                if any(f["target"] == "num_workers" and f["value"] == 4 for f in c["fixes"]))
    assert data["status"] == "faster" and data["significant"] is True, data["detail"]
    assert data["speedup"] >= 1.5 and data["ci_low"] > 1.0  # beyond noise: the interval's low end too
    assert abs(data["loss_change"]) <= 0.1
    assert result["verdict"].startswith("best: ") and result["best"] is not None
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "DataLoader(" in text)
    assert data["applied_at"] == [f"{script}:{line}"]
    assert data["change"][0] == f"--- {script}:{line}" and "num_workers=4" in data["change"][-1]
    assert data["measured_saving"] > 0
    finding = next((c for c in result["candidates"] if c["finding"] == "data_loading.exposed"), None)
    assert finding is None or finding["predicted_saving"] > 0  # the diagnosis's prediction, where it proposed one
    # No CUDA here: the diagnosis proposes nothing that needs one (pin_memory, cuDNN, TF32).
    assert not any(f["target"] == "pin_memory" or f["target"].startswith(("torch.backends.cud", "torch.cuda."))
                   for c in result["candidates"] for f in c["fixes"])


def test_a_foreach_optimizer_is_applied_and_measured(tmp_path: Path) -> None:
    """foreach=True really reaches the script's Adam (its trial's trace runs foreach ops); whether it is
    faster depends on the machine (on this 2-core CPU it is within noise), so the test asserts the
    measurement is made and reported, not a speed-up."""
    script = EXAMPLES / "adam_foreach_false.py"
    # `--try`: this candidate alone, whether or not (or in which order) the diagnosis proposes it.
    result = _tune(str(script), tmp_path, "--baselines", "1", "--repeats", "1", "--warmup", "1", "--active", "4",
                   "--keep", str(tmp_path / "trials"), "--only", "--try", "foreach=True")
    optimizer = next(c for c in result["candidates"] if [(f["target"], f["value"]) for f in c["fixes"]] == [("foreach", True)])
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "optim.Adam(" in text)
    assert optimizer["applied_at"] == [f"{script}:{line}"]
    _assert_the_trial_ran(optimizer, "foreach")
    assert optimizer["status"] in ("faster", "slower", "no significant change")
    # ci_high is null where the interval's low end reaches -100 % of the step (an unbounded speed-up):
    # with one baseline and one trial the per-step interval can be that wide on a loaded machine.
    assert optimizer["speedup"] > 0 and optimizer["ci_low"] is not None
    assert optimizer["ci_high"] is None or optimizer["ci_high"] >= optimizer["speedup"] >= optimizer["ci_low"]
    assert optimizer["measured_saving"] is not None
    # The diagnosis's prediction where it proposed foreach as its first fix; as the alternative to fused
    # (a CPU torch with the fused kernel) the finding's cost is fused's, so foreach has none.
    fused = [c for c in result["candidates"] if c["finding"] == "optimizer.step" and c is not optimizer]
    if optimizer["finding"] is not None:
        assert optimizer["finding"] == "optimizer.step"
        assert optimizer["predicted_saving"] is None if fused else optimizer["predicted_saving"] > 0
        assert all(c["predicted_saving"] > 0 for c in fused)
    assert optimizer["loss_change"] is not None and abs(optimizer["loss_change"]) < 1e-3  # same arithmetic


def _assert_the_trial_ran(candidate: dict, implementation: str) -> None:
    """The trial's own trace shows the optimizer's kernels as forced (not the per-parameter loop)."""
    optimizer = analyze(Path(candidate["trial_dir"]), jobs=1).measurements.optimizer
    assert optimizer.implementation == implementation, optimizer
    assert (optimizer.fused_ops_per_step if implementation == "fused" else optimizer.foreach_ops_per_step) > 0


def test_a_fused_optimizer_is_measured_faster_and_beyond_noise_where_the_machine_allows(tmp_path: Path) -> None:
    """optimizer_bound gains from fused: Adam(foreach=False) over 300 small tensors (3,600 per-parameter
    ops per step), `--only --try fused=True` (whichever of foreach and fused the diagnosis lists first).
    The trial's trace shows the fused kernel; fused is measured >= 1.15x faster, and where the baselines'
    runs spread 10 % or less it must be called faster beyond noise (95 % interval's low end above 1).

    Measured with tune (OMP_NUM_THREADS=1, 12 runs while three other engineers ran tests, load 2-6):
    the fused trial's steps stay at 45-60 ms (`_fused_adam_` ~1 ms) while the per-parameter baseline's
    go from 65-80 ms (least load) to 300 ms with the load, so the speed-up is ~1.35-1.6x on a quiet
    machine and larger under load (1.67-5.47x in 10 runs; 1.07x and 1.25x in two where a fused run hit a
    load burst; unprofiled the lead measured Adam 13-27 -> 3.4-6.3 ms of a 30-51 ms step). Whether it is
    beyond noise depends on the baselines' run-to-run spread: every run whose spread was <= 15 % (4 of
    them: 3.4-12.3 %) called fused faster beyond noise; at 16-70 % it was within noise in 6 of 8. As a
    pytest run requiring significance whatever the spread (5 runs, load 1.6-3.8) it passed twice and
    failed 3 times (spreads 23-38 %, speed-ups down to 1.36x): a shared 2-core VM cannot promise a spread.
    1.15: below every speed-up measured but the 1.07x of a run whose second of two fused trials hit a
    load burst (105 against 50 ms per step); a third trial (`--repeats 3`) dilutes such a burst.
    Where the condition starts: with four baselines and three trials the interval's half-width is about
    1.5x the baselines' spread (pooled with the barely spreading fused runs; Student's t at 5 degrees of
    freedom), so a speed-up s is beyond noise only below a spread of about (1 - 1/s) / 1.5: 13 % for
    1.25x, 10 % for 1.18x. A quiet clean-clone CI run (2026-12-02) measured 1.26x at a 13.8 % spread,
    interval 0.90-2.07x: within noise, as that arithmetic says; hence 10 % (it was 15 %).
    Hence the condition; and 20 steps (14 measured: a run's mean spans a load burst), four baselines,
    up to three fused trials while within noise (`--repeats 3`: the spread is pooled in ms and fused
    runs barely spread, so a repeat narrows the interval). The step count is the only change to the
    example (a copy), so its bottleneck is the same.

    OMP_NUM_THREADS=1 (both sides): the CPU fused kernel runs a parallel region per parameter tensor,
    and with two intra-op threads on two cores one of which another process holds, each region waits
    for a descheduled thread: unprofiled fused steps then took 1-2.4 s, and tune measured fused 0.21x
    (slower, beyond noise). That is tune telling the truth about a shared machine (docs/tune.md); a
    test must not depend on it."""
    example = (EXAMPLES / "adam_foreach_false.py").read_text()
    assert example.count("range(8)") == 1
    script = tmp_path / "adam_foreach_false.py"
    script.write_text(example.replace("range(8)", "range(20)"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = _tune(str(script), tmp_path, "--baselines", "4", "--active", "14", "--repeats", "3",
                   "--keep", str(tmp_path / "trials"), "--only", "--try", "fused=True", env=env)
    fused = next(c for c in result["candidates"] if [(f["target"], f["value"]) for f in c["fixes"]] == [("fused", True)])
    line = next(n for n, text in enumerate(example.splitlines(), 1) if "optim.Adam(" in text)
    assert fused["applied_at"] == [f"{script}:{line}"], fused
    _assert_the_trial_ran(fused, "fused")
    shown = ({k: fused[k] for k in ("status", "speedup", "ci_low", "ci_high", "detail")}, result["noise_pct"])
    assert fused["speedup"] >= 1.15 and fused["status"] in ("faster", "no significant change"), shown
    assert abs(fused["loss_change"]) < 1e-3 and fused["measured_saving"] > 0
    assert result["baseline_steps"] == 4 * 14
    if result["noise_pct"] <= 10.0:  # the machine lets tune tell: then it must
        assert fused["status"] == "faster" and fused["significant"] is True and fused["ci_low"] > 1.0, shown
        assert result["verdict"] == f"best: fused=True ({fused['speedup']:.2f}x)" and result["best"] == "fused=True"
        assert fused["change"] and "fused=True" in fused["change"][-1]  # the code change shown for the winner
    else:
        assert result["verdict"] in (f"best: fused=True ({fused['speedup']:.2f}x)", "no candidate beats the baseline beyond noise")


def test_a_healthy_compute_bound_script_has_no_winner_among_its_own_candidates(tmp_path: Path) -> None:
    """No candidate of the diagnosis's own beats a compute-bound script beyond noise, and the verdict
    (JSON and terminal) says so. The script (MATMULS) is matmuls only: on this CPU the diagnosis proposes
    bfloat16 autocast (no bf16 units: measured 0.07x) and torch.compile (the same GEMMs: 0.57x, within
    noise), run in 2 trials besides the 3 baselines (3 measured steps each; 40-80 s at load 2-3.5).

    Why not examples/bottlenecks/healthy_convnet.py or the 3-layer MLP this test ran before
    (Linear 512-1024-512 with a ReLU, docs/performance.md): their torch.compile
    candidates were genuinely faster on this machine under load (convnet 1.58x beyond noise, MLP 1.65-2.2x):
    with two intra-op threads and another process on one of the two cores, eager's many parallel regions
    each wait for a descheduled thread, and compiled code runs fewer. So there the diagnosis was right.
    OMP_NUM_THREADS=1 takes that contention out of both sides (this MLP with two threads: 238 ms per step
    at load 2, with one 53 ms), and with one thread the diagnosis proposed no thread change here.

    False wins: at 99 % confidence with one look per candidate (`--repeats 1`), a null candidate is
    called faster well under 0.5 % of the time (tests/unit/test_noise_runs.py: 0.5 % with the repeat),
    so about 1 % for the 2 candidates. The test can fail: a candidate that failed or was not applied, or
    one that is faster by more than the interval (at the 2 % floor, ~25 %), is not allowed. Skipped on a CPU
    with bfloat16 units, where autocast may be a genuine win (the diagnosis right, not a false one)."""
    import msgspec
    import torch

    from torchscope.render.tune_terminal import render_tune_terminal
    from torchscope.report.tune import TuneResult

    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has bfloat16 units: the autocast candidate can be a real win")
    (tmp_path / "healthy.py").write_text(MATMULS)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    result = _tune("healthy.py", tmp_path, "--warmup", "1", "--active", "3", "--confidence", "0.99", "--repeats", "1",
                   env=env)
    own = result["candidates"]
    assert own and all(c["finding"] for c in own)  # the diagnosis's own: nothing asked for with --try
    assert any(c["finding"] == "compute.bound" for c in own)
    assert len(own) <= 3, [c["fix"] for c in own]  # the false-win risk above counts on few candidates
    assert all(c["status"] in ("slower", "no significant change") and c["applied_at"] for c in own), own
    assert all("over run means" in c["detail"] for c in own)  # the run-level interval, 3 baselines
    assert result["verdict"] == "no candidate beats the baseline beyond noise" and result["best"] is None
    assert result["combination"] is None and result["noise_pct"] >= 2.0 and result["baseline_steps"] == 9
    terminal = render_tune_terminal(msgspec.json.decode(json.dumps(result), type=TuneResult))
    assert "verdict: no candidate beats the baseline beyond noise" in terminal


def test_checkpoints_stay_out_of_the_users_directory_and_ctrl_c_returns_what_was_measured(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(CHECKPOINTING)
    before = sorted(p.name for p in tmp_path.iterdir())
    # --try: a candidate whatever the diagnosis advises on this machine, so there is a trial to interrupt.
    tune = subprocess.Popen([sys.executable, "-m", "torchscope", "tune", "--format", "json", "--baselines", "1",
                             "--try", "num_workers=2", "train.py"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    assert tune.stderr is not None
    for line in tune.stderr:  # the baseline is measured once the first candidate's trial starts
        if "tune: trial 1/" in line:
            break
    time.sleep(1.0)
    os.kill(tune.pid, signal.SIGINT)
    out, err = tune.communicate(timeout=60)
    assert tune.returncode == 130, err
    result = json.loads(out)
    assert result["interrupted"] is True and result["baseline_steps"] == 5
    assert result["candidates"] and all(c["status"] == "skipped" and c["detail"] == "not run: interrupted"
                                        for c in result["candidates"])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no checkpoint, no log: they went to the trial's folder


DDP_MODULE = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(8):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(torch.ones(8, 16)), torch.zeros(8, 1)).backward()
    optimizer.step()
dist.destroy_process_group()
"""


def test_a_ddp_module_is_tuned_under_torchrun(tmp_path: Path) -> None:
    """`-m` imports the user's package from their directory although the trial runs elsewhere, and each
    trial is a 2-rank torchrun launch whose ranks' steps are merged (a step ends with its slowest rank)."""
    pytest.importorskip("torch.distributed")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "ddp.py").write_text(DDP_MODULE)
    # pin_memory needs a CUDA device: skipped on this CPU machine, so the baseline is the only launch.
    result = _tune("pkg.ddp", tmp_path, "--baselines", "1", "--nproc-per-node", "2", "--warmup", "1", "--active", "4",
                   "--only", "--try", "pin_memory=True", "-m")
    assert result["command"] == ["-m", "pkg.ddp"] and result["trials"] == 1
    pinned = next(c for c in result["candidates"] if c["fix"] == "pin_memory=True")
    assert pinned["status"] == "skipped" and "needs a CUDA device" in pinned["detail"]
    assert result["baseline_steps"] == 4 and result["baseline_step_us"] > 0


def test_torch_compile_is_applied_its_compile_time_kept_out_of_the_steady_steps(tmp_path: Path) -> None:
    """The model compiled where the script calls it (inductor, gcc on this CPU); the first compiled step's
    excess is reported as compile time, apart from the measured steps after it."""
    (tmp_path / "train.py").write_text(COMPILED)
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no compile worker pool on a busy 2-core machine
    result = _tune("train.py", tmp_path, "--baselines", "1", "--repeats", "1", "--warmup", "1", "--active", "3",
                   "--only", "--try", "torch.compile", env=env)
    compiled = next(c for c in result["candidates"] if c["fix"] == "model = torch.compile(model)")
    others = [c for c in result["candidates"] if c is not compiled]  # the diagnosis's, listed but not run
    assert all(c["status"] == "skipped" and "--only" in c["detail"] for c in others)
    assert compiled["applied_at"] == [f"{tmp_path / 'train.py'}:9"]
    assert compiled["status"] in ("faster", "slower", "no significant change"), compiled["detail"]
    assert compiled["compile_s"] > 0 and compiled["step_us"] > 0
    # The compile time is not in the steps: it is longer than the three measured steps together.
    assert compiled["compile_s"] > 3 * compiled["step_us"] / 1e6
    assert abs(compiled["loss_change"]) < 1e-3
    assert result["trials"] == 2 and result["baseline_steps"] == 3
    # The change a win would show (`change` is filled for winners only): after the model's construction.
    from torchscope.pipeline.tune_snippets import code_change
    from torchscope.report.model import Fix

    fixes = [Fix(**f) for f in compiled["fixes"]]
    assert code_change(fixes, {"code_change:torch.compile": compiled["applied_at"]}) == [
        f"--- {tmp_path / 'train.py'}:4", f"  {COMPILED.splitlines()[3]}", "+ model = torch.compile(model)"]


# A script that sets its own intra-op threads, as many do (and as the oversubscription advice touches).
OWN_THREADS = """
import torch
torch.set_num_threads(2)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randn(64, 1)
for _ in range(8):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
"""


def test_the_threads_trial_keeps_its_count_against_the_scripts_own_set_num_threads(tmp_path: Path) -> None:
    """Before, the script's `torch.set_num_threads(2)` undid the trial's count before the first step: the
    trial measured the script unchanged. Now the trial runs on its count and the change edits that line."""
    script = tmp_path / "own_threads.py"
    script.write_text(OWN_THREADS)
    result = _tune(str(script), tmp_path, "--baselines", "1", "--repeats", "1", "--warmup", "1", "--active", "3",
                   "--keep", str(tmp_path / "trials"), "--only", "--try", "set_num_threads=1")
    (threads,) = [c for c in result["candidates"] if [f["target"] for f in c["fixes"]] == ["torch.set_num_threads"]]
    manifest = json.loads((Path(threads["trial_dir"]) / "run.json").read_text())
    assert manifest["environment"]["torch_num_threads"] == 1
    assert threads["applied_at"] == sorted(["process-wide", f"{script}:3"])
    if threads["status"] == "faster":  # the change is shown for a winner only
        assert threads["change"] == [f"--- {script}:3", "- torch.set_num_threads(2)", "+ torch.set_num_threads(1)"]
