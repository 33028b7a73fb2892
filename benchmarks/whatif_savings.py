"""Predicted vs measured saving of each planted bottleneck (examples/bottlenecks/).

    .venv/bin/python benchmarks/whatif_savings.py [--runs 16] [--active 5]

For each planted script: capture it as written and with its fix applied for real
(`TORCHSCOPE_EXAMPLE_FIXED=1`: the DataLoader workers and intra-op threads the finding advised on this
machine, fused=True (foreach=True before PyTorch 2.4), a batched forward, a checkpoint every 100 steps), `--runs` times each, alternating. The prediction is the planted finding's saving
(`time_share`, low..high) times the unfixed run's mean step; the measured saving is the share of the
step the fix saved, pair by pair (plain and fixed run captured back to back see about the same load), so
both are medians over pairs times the median unfixed step. Prints a markdown table (docs/rules.md holds one). Not a test: it takes minutes
and its answer depends on how busy the machine is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torchscope  # noqa: E402
from torchscope.report.model import Finding, Report  # noqa: E402

# script -> the finding id that names its planted problem
PLANTED = {
    "slow_getitem.py": "data_loading.exposed",
    "python_loop_forward.py": "host_overhead.dispatch",
    "adam_foreach_false.py": "optimizer.step",
    "checkpoint_every_step.py": "outside_steps.work",
}


# finding -> the phases its cause runs in: what the fix saved there (plain minus fixed phase time, per
# step) is printed beside the step's saving, since under load the other phases' noise can swamp the latter.
PHASES = {
    "data_loading.exposed": ("data_loading",),
    "host_overhead.dispatch": ("forward", "backward"),
    "optimizer.step": ("optimizer",),
    "outside_steps.work": ("other",),
}


def phase_us(report: Report, finding_id: str) -> float:
    """Time per step of the phases the planted cause runs in."""
    return sum(report.phases[p].percent / 100.0 * report.mean_step_us for p in PHASES[finding_id] if p in report.phases)


@dataclass(frozen=True)
class Case:
    """One script's captures, paired: plain run i and fixed run i were captured back to back, so each
    pair saw about the same machine load; shares of the plain step are compared pair by pair."""

    script: str
    findings: list[Finding]  # the planted finding of each plain run
    steps_us: list[float]
    fixed_steps_us: list[float]
    applied: str = ""  # the machine-dependent fix values the fixed runs used
    phase_saved_us: tuple[float, ...] = ()  # per pair: what the fix saved in the cause's own phases

    @property
    def step_us(self) -> float:
        return statistics.median(self.steps_us)

    @property
    def fixed_step_us(self) -> float:
        return statistics.median(self.fixed_steps_us)

    @property
    def measured_us(self) -> float:
        """The median over pairs of the share of the step the fix saved, times the median step."""
        return statistics.median(1.0 - f / s for s, f in zip(self.steps_us, self.fixed_steps_us)) * self.step_us

    def predicted_us(self, which: str = "time_share") -> float:
        return statistics.median(getattr(f, which) or 0.0 for f in self.findings) * self.step_us


def advised(report: Report, script: str) -> dict[str, str]:
    """The planted finding's machine-dependent fix values (workers, intra-op threads) as the environment
    variables the example reads, so the fixed run applies what this machine was advised."""
    finding = next(f for f in report.findings if f.id == PLANTED[script])
    names = {"num_workers": "TORCHSCOPE_EXAMPLE_NUM_WORKERS", "torch.set_num_threads": "TORCHSCOPE_EXAMPLE_NUM_THREADS"}
    return {names[f.target]: str(f.value) for f in finding.fixes if f.target in names and isinstance(f.value, int)}


def capture(script: str, fixed: bool, active: int, out: Path, extra: dict[str, str] | None = None) -> Report:
    env = {**os.environ, "TORCHSCOPE_EXAMPLE_FIXED": "1" if fixed else "0", **(extra or {})}
    command = [sys.executable, "-m", "torchscope", "run", "--out", str(out), "--no-report",
               "--wait", "1", "--warmup", "1", "--active", str(active), str(REPO / "examples" / "bottlenecks" / script)]
    subprocess.run(command, check=True, capture_output=True, env=env, timeout=600)
    return torchscope.analyze(out, jobs=1, use_cache=False)


def measure(script: str, runs: int, active: int, root: Path) -> Case:
    plain: list[Report] = []
    fixed: list[Report] = []
    for i in range(runs):
        # Alternate, so a change in machine load hits both sides alike, and swap the order within every
        # other pair (plain-fixed, fixed-plain, ...), so whatever favours the first or second process of a
        # pair (page cache, CPU frequency) cancels instead of biasing the saving. A fixed run that goes
        # first applies the advice of the previous pair's plain run (the same machine, moments before).
        if i % 2 == 0:
            plain.append(capture(script, False, active, root / f"{script}-plain-{i}"))
            fixed.append(capture(script, True, active, root / f"{script}-fixed-{i}", advised(plain[-1], script)))
        else:
            fixed.append(capture(script, True, active, root / f"{script}-fixed-{i}", advised(plain[-1], script)))
            plain.append(capture(script, False, active, root / f"{script}-plain-{i}"))
    findings = [next(f for f in r.findings if f.id == PLANTED[script]) for r in plain]
    applied = " ".join(sorted({f"{k.removeprefix('TORCHSCOPE_EXAMPLE_').lower()}={v}" for r in plain for k, v in advised(r, script).items()}))
    saved = tuple(phase_us(p, PLANTED[script]) - phase_us(f, PLANTED[script]) for p, f in zip(plain, fixed))
    return Case(script, findings, [r.mean_step_us for r in plain], [r.mean_step_us for r in fixed], applied, saved)


def table(cases: list[Case]) -> str:
    rows = [
        "| script | finding | step (ms) | fixed step (ms) | predicted saving (ms) | range (ms) | measured saving (ms) | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        predicted = c.predicted_us()
        error = (predicted - c.measured_us) / c.measured_us if c.measured_us else float("nan")
        rows.append(
            f"| `{c.script}` | `{PLANTED[c.script]}`{' (' + c.applied + ')' if c.applied else ''} | {c.step_us / 1e3:.1f} | {c.fixed_step_us / 1e3:.1f} | "
            f"{predicted / 1e3:.1f} | {c.predicted_us('time_share_low') / 1e3:.1f}-"
            f"{c.predicted_us('time_share_high') / 1e3:.1f} | {c.measured_us / 1e3:.1f} | {100 * error:+.0f} % |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 16: a step-level median needs about 15 pairs on a shared VM, where the phases a fix leaves alone vary
    # ~15 % from one process to the next (docs/rules.md, adam_foreach_false).
    parser.add_argument("--runs", type=int, default=16, help="captures per variant (the median is kept)")
    parser.add_argument("--active", type=int, default=5, help="profiled steps per capture")
    parser.add_argument("--only", nargs="*", default=list(PLANTED), choices=list(PLANTED), help="scripts to run")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads for every capture (OMP_NUM_THREADS; 0: torch's default). On a "
                        "machine others load, 1 avoids parallel ops stalling on a descheduled thread")
    args = parser.parse_args(argv)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        cases = [measure(script, args.runs, args.active, Path(folder)) for script in args.only]
    print(table(cases))
    for c in cases:  # the pairs behind each row: predicted vs measured share of the unfixed step
        pairs = ", ".join(f"{f.time_share or 0.0:.2f} vs {1.0 - b / a:.2f}" for f, a, b in zip(c.findings, c.steps_us, c.fixed_steps_us))
        print(f"  {c.script}: predicted vs measured share per pair: {pairs}")
        phases = ", ".join(f"{f.time_share * a / 1e3 if f.time_share else 0.0:.1f} vs {saved / 1e3:.1f}"
                           for f, a, saved in zip(c.findings, c.steps_us, c.phase_saved_us))
        print(f"    predicted vs saved in its own phases ({'+'.join(PHASES[PLANTED[c.script]])}), ms per step: {phases}")
    threads = f"OMP_NUM_THREADS={args.threads}; " if args.threads else ""
    print(f"\n{threads}{args.runs} captures per variant, {args.active} profiled steps each; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {os.cpu_count()} CPUs.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
