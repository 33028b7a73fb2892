"""`diff(base, new)`: compare two runs (run directories, trace files or saved JSON reports of any schema
version) step time, breakdown, metrics, operators, kernels and findings, each change judged against the
runs' own step-to-step noise (pipeline/noise.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Optional, Sequence

import msgspec

from torchscope.errors import InputError
from torchscope.files import read_regular
from torchscope.pipeline.analyze import analyze
from torchscope.pipeline.noise import DEFAULT_RUN_NOISE_PCT, Interval, relative_change_interval
from torchscope.report.diff import (
    CategoryChange,
    FindingChange,
    MetricChange,
    ReportDiff,
    RowChange,
    RunRef,
    StepTimeChange,
)
from torchscope.report.model import CategoryTime, Metric, Report, StepRow, decode_report
from torchscope.rundir.contention import OTHERS_BUSY_SHARE, oversubscribed

# Metrics without per-step samples (peaks, utilisation) have no noise estimate: a change this large counts.
UNSAMPLED_TOLERANCE_PCT = 2.0
MAX_REPORT_BYTES = 64 << 20
TOP_ROWS = 50


def load_report(path: str | Path, jobs: int | None = None, use_cache: bool = True) -> Report:
    """The Report of `path`: a saved torchscope JSON report is read, anything else is analysed."""
    path = Path(path)
    data = _report_bytes(path) if path.suffix == ".json" else None
    if data is not None:
        try:
            return decode_report(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InputError(f"{path}: not a usable torchscope report ({exc})") from None
    return analyze(path, jobs=jobs, use_cache=use_cache)


def _report_bytes(path: Path) -> bytes | None:
    """The file's bytes if it is a saved report: a JSON object with `schema_version` and `run` and no
    `traceEvents` (key order not assumed: reports are often saved key-sorted by other tools). Read through
    the guarded opener (regular files only, at most MAX_REPORT_BYTES: reports are small, a larger file is
    a trace); anything else is left to the trace loader, which says why it cannot be read."""
    try:
        data = read_regular(path, MAX_REPORT_BYTES)
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return data if "schema_version" in top and "run" in top and "traceEvents" not in top else None


def diff_paths(
    base: str | Path, new: str | Path, jobs: int | None = None, use_cache: bool = True,
    run_noise_pct: float = DEFAULT_RUN_NOISE_PCT,
) -> ReportDiff:
    reports = load_report(base, jobs, use_cache), load_report(new, jobs, use_cache)
    return diff_reports(*reports, str(base), str(new), run_noise_pct=run_noise_pct)


def diff_reports(
    base: Report, new: Report, base_path: str = "base", new_path: str = "new", run_noise_pct: float = DEFAULT_RUN_NOISE_PCT
) -> ReportDiff:
    """Every comparison of the two Reports (pure: no I/O); `run_noise_pct`: see pipeline/noise.py."""
    warnings = []
    if base.run.device_kind != new.run.device_kind:
        warnings.append(f"the runs ran on different devices ({base.run.device_kind} and {new.run.device_kind})")
    if base.run.step_source != "profiler_step" or new.run.step_source != "profiler_step":
        warnings.append("a run has no ProfilerStep markers: its 'step' is the whole trace")
    warnings += [w for w in (busy_machine(base, "base"), busy_machine(new, "new")) if w]
    warnings += [f"the {side} run holds no step (every step was cut off): its figures are zeros, not measurements"
                 for side, report in (("base", base), ("new", new)) if not report.steps]
    return ReportDiff(
        base=_ref(base, base_path),
        new=_ref(new, new_path),
        step_time=step_time_change(base, new, run_noise_pct),
        breakdown=_categories(base, new, lambda r: r.breakdown),
        phases=_categories(base, new, lambda r: r.phases),
        metrics=metric_changes(base, new, run_noise_pct),
        operators=_rows(base, new, kernels=False),
        kernels=_rows(base, new, kernels=True),
        findings=_findings(base, new),
        warnings=warnings,
    )


def busy_machine(report: Report, label: str) -> str | None:
    """A warning when the run was captured on a busy machine (the manifest's `environment.contention`,
    capture/machine.py): more runnable threads than CPUs (1-minute load average above the CPU count by
    half a CPU, as rules_input reads it) or other processes using over OTHERS_BUSY_SHARE of the CPUs
    (rundir/contention.py). Its
    step times then carry that load, which changes from run to run beyond what `--run-noise` models."""
    environment = report.run.manifest.get("environment")
    contention = environment.get("contention") if isinstance(environment, dict) else None
    if not isinstance(contention, dict):
        return None
    load, cpus, others = (contention.get(k) for k in ("load_average_1m", "cpus", "other_share"))
    load = load if isinstance(load, (int, float)) else None
    cpus = cpus if isinstance(cpus, int) and cpus > 0 else None
    others = others if isinstance(others, (int, float)) else None
    if not (oversubscribed(load, cpus) or (others is not None and others > OTHERS_BUSY_SHARE)):
        return None
    figures = ", ".join(
        ([f"load average {load:g} on {cpus} CPUs"] if load is not None and cpus is not None else [])
        + ([f"other processes used {others:.0%} of its CPUs"] if others is not None else [])
    )
    return f"the {label} run was captured on a busy machine ({figures}): its times carry that load, so timing verdicts may be the load, not the code"


def _ref(report: Report, path: str) -> RunRef:
    return RunRef(
        path=path,
        schema_version=report.schema_version,
        torchscope_version=report.torchscope_version,
        device_kind=report.run.device_kind,
        ranks=report.run.ranks,
        steps=len(step_samples(report)),
    )


def step_samples(report: Report, value: Callable[[StepRow], float] = lambda s: s.duration_us) -> list[float]:
    """One sample per step: on several ranks, the slowest rank's (a step ends when its last rank does)."""
    by_step: dict[tuple[int, int], float] = {}
    for row in report.steps:
        key = (row.span, row.step)
        by_step[key] = max(by_step.get(key, float("-inf")), value(row))
    return list(by_step.values())


def step_time_change(base: Report, new: Report, run_noise_pct: float = DEFAULT_RUN_NOISE_PCT) -> StepTimeChange:
    b, n = step_samples(base), step_samples(new)
    interval = relative_change_interval(b, n, run_noise_pct=run_noise_pct)
    return StepTimeChange(
        base_us=_mean(b),
        new_us=_mean(n),
        change_pct=interval.change_pct,
        ci_low_pct=interval.low_pct,
        ci_high_pct=interval.high_pct,
        significant=interval.significant,
        verdict=("slower" if interval.change_pct > 0 else "faster") if interval.significant else "no significant change",
        base_steps=len(b),
        new_steps=len(n),
        base_median_us=statistics.median(b) if b else 0.0,
        new_median_us=statistics.median(n) if n else 0.0,
        base_stdev_us=statistics.stdev(b) if len(b) > 1 else 0.0,
        new_stdev_us=statistics.stdev(n) if len(n) > 1 else 0.0,
        method=interval.method,
    )


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def metric_changes(base: Report, new: Report, run_noise_pct: float = DEFAULT_RUN_NOISE_PCT) -> list[MetricChange]:
    """Each metric of either Report; those backed by per-step samples get a noise interval."""
    base_metrics = {m.name: m for m in base.metrics}
    new_metrics = {m.name: m for m in new.metrics}
    names = list(base_metrics) + [n for n in new_metrics if n not in base_metrics]
    return [_metric(name, base_metrics.get(name), new_metrics.get(name), base, new, run_noise_pct) for name in names]


def _metric(name: str, b: Metric | None, n: Metric | None, base: Report, new: Report, run_noise_pct: float) -> MetricChange:
    known = b or n
    assert known is not None
    if b is None or n is None:
        return MetricChange(name=name, unit=known.unit, better=known.better, base=b.value if b else None,
                            new=n.value if n else None, change_pct=None, verdict="not comparable")
    samples = _metric_samples(name)
    change = 100.0 * (n.value - b.value) / abs(b.value) if b.value else (0.0 if n.value == b.value else float("inf"))
    if samples is not None:
        interval = relative_change_interval(step_samples(base, samples), step_samples(new, samples), run_noise_pct=run_noise_pct)
        significant = interval.significant
    elif name.startswith(("step_time.", "throughput.")):
        # Other statistics of the same step samples: beyond noise when the mean step time is (the spread
        # itself has no interval and is never called a change).
        interval = Interval(change, None, None, "from the step-time samples")
        step_interval = relative_change_interval(step_samples(base), step_samples(new), run_noise_pct=run_noise_pct)
        significant = not name.endswith("stdev_us") and step_interval.significant
    else:
        interval = Interval(change, None, None, "no samples")
        significant = abs(change) >= UNSAMPLED_TOLERANCE_PCT
    verdict: str = "no significant change"
    if significant and known.better != "none":
        worse = interval.change_pct > 0 if known.better == "lower" else interval.change_pct < 0
        verdict = "worse" if worse else "better"
    return MetricChange(
        name=name, unit=known.unit, better=known.better, base=b.value, new=n.value,
        change_pct=interval.change_pct if interval.change_pct != float("inf") else None,
        ci_low_pct=interval.low_pct, ci_high_pct=interval.high_pct, significant=significant,
        verdict=verdict,  # type: ignore[arg-type]
    )


def _metric_samples(name: str) -> Callable[[StepRow], float] | None:
    """The per-step values behind a metric, where it is a mean over steps."""
    if name == "step_time.mean_us":
        return lambda s: s.duration_us
    for prefix, field in (("breakdown.", "breakdown"), ("phases.", "phases")):
        if name.startswith(prefix) and name.endswith("_us"):
            category = name[len(prefix) : -len("_us")]
            return lambda s, c=category, f=field: getattr(s, f).get(c, 0.0)  # type: ignore[misc]
    return None


def _categories(base: Report, new: Report, table: Callable[[Report], dict[str, CategoryTime]]) -> list[CategoryChange]:
    b, n = table(base), table(new)
    zero = CategoryTime(us=0.0, percent=0.0)
    return [
        CategoryChange(
            category=c,
            base_us=b.get(c, zero).us,
            new_us=n.get(c, zero).us,
            base_percent=b.get(c, zero).percent,
            new_percent=n.get(c, zero).percent,
            change_pp=n.get(c, zero).percent - b.get(c, zero).percent,
            change_us=n.get(c, zero).us - b.get(c, zero).us,
        )
        for c in list(b) + [c for c in n if c not in b]
    ]


# An operator's calls the report lists no call site for (outside its top sites, or with no user frame).
OTHER_SITES = "(other call sites)"
RowKey = tuple[str, Optional[str], Optional[str]]  # name, input shapes, call site
RowTimes = dict[RowKey, tuple[float, int]]  # key -> (host + device self us, calls), totals over the run


def _rows(base: Report, new: Report, kernels: bool) -> list[RowChange]:
    """Operators matched by (name, input shapes, call site), kernels by name (see `operator_keys` and
    `kernel_keys`); times per step, so runs of different lengths compare; the largest movers first."""
    b_steps, n_steps = max(len(step_samples(base)), 1), max(len(step_samples(new)), 1)
    b_rows, n_rows = kernel_keys(base, new) if kernels else operator_keys(base, new)
    launchers = {k.name: k.launched_by for k in (*base.kernels, *new.kernels) if k.launched_by} if kernels else {}
    out = []
    for key in list(b_rows) + [k for k in n_rows if k not in b_rows]:
        bt, bc = b_rows.get(key, (0.0, 0))
        nt, nc = n_rows.get(key, (0.0, 0))
        status = "added" if key not in b_rows else "removed" if key not in n_rows else "changed"
        out.append(RowChange(
            name=key[0], input_shapes=key[1], call_site=key[2], launched_by=launchers.get(key[0]),
            base_us_per_step=bt / b_steps, new_us_per_step=nt / n_steps,
            change_us_per_step=nt / n_steps - bt / b_steps, base_calls_per_step=bc / b_steps,
            new_calls_per_step=nc / n_steps, status=status,  # type: ignore[arg-type]
        ))
    out.sort(key=lambda r: -abs(r.change_us_per_step))
    return out[:TOP_ROWS]


def kernel_keys(base: Report, new: Report) -> tuple[RowTimes, RowTimes]:
    """Kernels by name: the report's kernel table has one row per name, and its `launched_by` is the
    most common launching operator, a label rather than a partition (keying on it would list a kernel as
    removed and added whenever its majority launcher flipped), so it is shown, not matched on."""
    return ({(k.name, None, None): (k.total_us, k.calls) for k in base.kernels},
            {(k.name, None, None): (k.total_us, k.calls) for k in new.kernels})


def operator_keys(base: Report, new: Report) -> tuple[RowTimes, RowTimes]:
    """Each side's operator times keyed by (name, input shapes, call site), at the finest grain BOTH
    reports recorded, so nothing is added or removed only because one side recorded more:

    * input shapes when both reports have the by-shape table, else None (name only);
    * call sites for an operator both reports list sites for, at least one the same on both sides
      (report.call_sites: the top operators' top user-code frames; none without stacks or in older reports). Its time is split by site instead of
      by shape (the report keeps sites and shapes apart, not jointly), plus an OTHER_SITES row for the
      calls without a listed site. A site listed on one side only is added/removed only when the other
      side's list is complete (every call has a site); otherwise it may be hiding in that side's
      unlisted rest, and both go to OTHER_SITES.
    """
    shapes = _has_shapes(base) and _has_shapes(new)
    b_sites, n_sites = _sites(base), _sites(new)
    # Sites split an operator only where they match: with none in common (the script renamed, the code
    # moved) every site would be "removed" and "added", so the operator is compared whole.
    sited = {name for name in b_sites.keys() & n_sites.keys() if b_sites[name].keys() & n_sites[name].keys()}
    b_rows, n_rows = _by_shape(base, shapes, sited), _by_shape(new, shapes, sited)
    for name in sorted(sited):  # a fixed order: rows that tie on their change keep it
        b_total, n_total = _operator_total(base, name), _operator_total(new, name)
        b_keep = _kept_sites(b_sites[name], n_sites[name], n_total)
        n_keep = _kept_sites(n_sites[name], b_sites[name], b_total)
        _add_sites(b_rows, name, b_sites[name], b_keep, b_total)
        _add_sites(n_rows, name, n_sites[name], n_keep, n_total)
    return b_rows, n_rows


def _by_shape(report: Report, shapes: bool, skip: set[str]) -> RowTimes:
    rows = report.operators_by_shape if shapes else report.operators
    out: RowTimes = {}
    for r in rows:
        if r.name not in skip:
            key = (r.name, r.input_shapes if shapes else None, None)
            us, calls = out.get(key, (0.0, 0))
            out[key] = (us + r.host_self_us + r.device_self_us, calls + r.calls)
    return out


def _sites(report: Report) -> dict[str, dict[str, tuple[float, int]]]:
    """operator -> site -> (host + device self us, calls), from report.call_sites."""
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for r in report.call_sites:
        us, calls = out.setdefault(r.operator, {}).get(r.site, (0.0, 0))
        out[r.operator][r.site] = (us + r.host_self_us + r.device_self_us, calls + r.calls)
    return out


def _operator_total(report: Report, name: str) -> tuple[float, int] | None:
    """The operator's whole time and calls (None when the table left it out)."""
    for r in report.operators:
        if r.name == name:
            return r.host_self_us + r.device_self_us, r.calls
    return None


def _kept_sites(mine: dict[str, tuple[float, int]], other: dict[str, tuple[float, int]], other_total: tuple[float, int] | None) -> set[str]:
    """My sites matched on their own: those the other side lists too, and all of mine if the other
    side's list is complete (its sites hold every call of the operator)."""
    complete = other_total is not None and sum(calls for _, calls in other.values()) >= other_total[1]
    return set(mine) if complete else set(mine) & set(other)


def _add_sites(rows: RowTimes, name: str, sites: dict[str, tuple[float, int]], keep: set[str], total: tuple[float, int] | None) -> None:
    kept_us, kept_calls = 0.0, 0
    for site in (s for s in sites if s in keep):  # the report's order, not a set's
        rows[(name, None, site)] = sites[site]
        kept_us += sites[site][0]
        kept_calls += sites[site][1]
    if total is None:  # no total to take the rest from: the listed sites it is
        total = (sum(us for us, _ in sites.values()), sum(c for _, c in sites.values()))
    rest_us, rest_calls = max(total[0] - kept_us, 0.0), max(total[1] - kept_calls, 0)
    if rest_calls > 0:
        rows[(name, None, OTHER_SITES)] = (rest_us, rest_calls)


def _has_shapes(report: Report) -> bool:
    return any(r.input_shapes not in (None, "", "[]") for r in report.operators_by_shape)


def _findings(base: Report, new: Report) -> list[FindingChange]:
    b = {f.id: f for f in base.findings}
    n = {f.id: f for f in new.findings}
    out = []
    for fid in list(n) + [i for i in b if i not in n]:
        fb, fn = b.get(fid), n.get(fid)
        if fb is None:
            status = "appeared"
        elif fn is None:
            status = "disappeared"
        else:
            same = fb.severity == fn.severity and abs((fb.time_share or 0) - (fn.time_share or 0)) < 0.01
            status = "unchanged" if same else "changed"
        shown = fn or fb
        assert shown is not None
        out.append(FindingChange(
            id=fid, title=shown.title, status=status,  # type: ignore[arg-type]
            base_share=fb.time_share if fb else None, new_share=fn.time_share if fn else None,
            base_severity=fb.severity if fb else None, new_severity=fn.severity if fn else None,
        ))
    return out
