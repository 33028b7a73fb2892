"""The run-directory contract (torchscope.rundir): names, discovery's use of them, the manifest's writer and
tolerant reader, the report's summary of it, and the one set of capture defaults (torch-free half; the
Profiler's keywords are compared in tests/integration/test_capture_profile.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from torchscope.analysis import markers, steps
from torchscope.cli.run import add_capture_options, config_from_args
from torchscope.errors import CaptureError
from torchscope.rundir import labels, layout
from torchscope.rundir import manifest as manifest_module
from torchscope.rundir.config import SCHEDULE_FIELDS, CaptureConfig
from torchscope.rundir.manifest import (
    CaptureOptions,
    Manifest,
    Schedule,
    build_manifest,
    manifest_summary,
    read_manifests,
    write_manifest,
)
from torchscope.trace.discover import discover

# -- layout ---------------------------------------------------------------------------------------------------


def test_manifest_names() -> None:
    assert layout.manifest_name(0, distributed=False) == "run.json"
    assert layout.manifest_name(3, distributed=True) == "run.rank3.json"
    assert all(layout.is_manifest_name(n) for n in ("run.json", "run.rank0.json", "run.rank12.json"))
    assert not any(layout.is_manifest_name(n) for n in ("run.rankx.json", "run.rank.json", "runs.json", "run.json.gz"))


def test_trace_names_round_trip() -> None:
    name = layout.trace_name(layout.worker_name("host", rank=1, pid=99), 1700000000123)
    assert name == "host_rank1.1700000000123.pt.trace.json"
    match = layout.TRACE_NAME.match(name + ".gz")
    assert match is not None and (match["worker"], match["span"]) == ("host_rank1", "1700000000123")
    assert layout.worker_name("host", rank=None, pid=99) == "host_99"


@pytest.mark.parametrize("name, is_trace", [
    ("h_1.1700000000000.pt.trace.json", True), ("h_1.1700000000000.pt.trace.json.gz", True), ("x.json", True),
    ("run.json", False), ("run.rank1.json", False), ("report.json", False), ("manifest.json", False),
    ("other.report.json", False), (".h_1.1.pt.trace.json.partial", False), (".hidden.json", False), ("x.txt", False),
])
def test_what_is_read_as_a_trace(name: str, is_trace: bool) -> None:
    assert layout.is_trace_name(name) is is_trace


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def test_discovery_skips_sidecars_variants_and_private_folders(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "train"
    trace = _touch(run / "h_1.1700000000000.pt.trace.json")
    for name in ("run.json", "report.json", "sidecars/h_1.1700000000000.pt.trace.json", "sidecars/lanes.json",
                 "variants/bs64/h_2.1700000000001.pt.trace.json", "variants/bs64/run.json",
                 f"{layout.CACHE_DIR}/h_1.json"):
        _touch(run / name)
    assert [ref.path for ref in discover(run)] == [trace]
    assert [ref.path for ref in discover(tmp_path / "runs")] == [trace]  # a folder of runs too


def test_a_variant_is_a_run_directory_of_its_own(tmp_path: Path) -> None:
    _touch(tmp_path / "h_1.1700000000000.pt.trace.json")
    variant = _touch(tmp_path / layout.VARIANTS_DIR / "bs64" / "h_2.1700000000001.pt.trace.json")
    assert [ref.path for ref in discover(variant.parent)] == [variant]


# -- labels ---------------------------------------------------------------------------------------------------


def test_labels_are_shared_with_the_analyses() -> None:
    assert labels.PHASE_LABELS == {
        "forward": "torchscope:forward", "backward": "torchscope:backward", "optimizer": "torchscope:optimizer",
    }
    assert all(label.startswith(labels.LABEL_PREFIX) for label in labels.PHASE_LABELS.values())
    assert (markers.PHASE_LABELS, markers.LABEL_PREFIX, markers.STEP_PREFIX, steps.STEP_PREFIX) == (
        labels.PHASE_LABELS, labels.LABEL_PREFIX, labels.STEP_PREFIX, labels.STEP_PREFIX)


# -- config ---------------------------------------------------------------------------------------------------


def test_the_cli_parses_to_the_config_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_capture_options(parser)
    assert config_from_args(parser.parse_args([])) == CaptureConfig()
    args = parser.parse_args(["--no-memory", "--no-phases", "--stop-after-active", "--active", "5", "--out", "o"])
    assert config_from_args(args) == CaptureConfig(
        out="o", active=5, profile_memory=False, phase_labels=False, stop_after_active=True)


@pytest.mark.parametrize("bad", [{"active": 0}, {"wait": -1}, {"repeat": -2}, {"skip_first": -1}])
def test_an_invalid_schedule_is_a_capture_error(bad: dict[str, int]) -> None:
    with pytest.raises(CaptureError, match="invalid schedule"):
        CaptureConfig(**bad)


# -- manifest: writing and reading ---------------------------------------------------------------------------


def _built(**overrides: Any) -> Manifest:
    facts: dict[str, Any] = dict(
        config=CaptureConfig(active=5, with_stack=False), step_marking="optimizer", phase_labels=True,
        command=["train.py", "--lr", "0.1"], rank=0, world_size=1, local_rank=0, start_time="2026-11-30T03:15:00.000Z",
        activities=["cpu"], trace_files=["h_1.1700000000000.pt.trace.json"], steps_seen=8, status="complete",
        errors=[], exit_code=0, torch_version="2.13.0", environment={"cpu_count": 4, "omp_num_threads": None},
    )
    return build_manifest(**{**facts, **overrides})


def test_the_manifest_records_the_config(tmp_path: Path) -> None:
    manifest = _built()
    assert manifest.schedule == Schedule(skip_first=0, wait=1, warmup=1, active=5, repeat=1)
    assert list(Schedule.__struct_fields__) == list(SCHEDULE_FIELDS)
    assert manifest.options == CaptureOptions(record_shapes=True, profile_memory=True, with_stack=False,
                                              with_flops=True, phase_labels=True, step_marking="optimizer")
    write_manifest(tmp_path / "run.json", manifest)
    text = (tmp_path / "run.json").read_text()
    assert text == json.dumps(msgspec.to_builtins(manifest), indent=2) + "\n"  # indented as before
    assert read_manifests(tmp_path) == [manifest]
    assert read_manifests(tmp_path / "h_1.1700000000000.pt.trace.json") == [manifest]  # a trace's folder


def _write(directory: Path, name: str, content: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    (directory / name).write_bytes(data)


def test_an_older_step_source_is_read_as_step_marking(tmp_path: Path) -> None:
    _write(tmp_path, "run.json", {"options": {"record_shapes": True, "step_source": "dataloader"}})
    [manifest] = read_manifests(tmp_path)
    assert manifest.options == CaptureOptions(record_shapes=True, step_marking="dataloader")


def test_fields_of_the_wrong_type_are_dropped_one_by_one(tmp_path: Path) -> None:
    _write(tmp_path, "run.json", {
        "world_size": "x", "status": 5, "activities": "cuda", "schedule": {"active": "3", "wait": 2}, "command": 7,
        "environment": "cpu_count=4", "steps_seen": True, "errors": ["ok"], "host": "h", "future_field": [1],
        "options": {"with_flops": 1, "step_marking": "sometimes", "phase_labels": False},
    })
    [manifest] = read_manifests(tmp_path)
    assert manifest == Manifest(schedule=Schedule(wait=2), options=CaptureOptions(phase_labels=False),
                                errors=["ok"], host="h")
    assert manifest.world_size is UNSET


def test_damaged_manifests_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "run.rank0.json", b"\x00garbage{{{")
    _write(tmp_path, "run.rank1.json", [1, 2, 3])
    _write(tmp_path, "run.rank2.json", b"[" * 500)
    _write(tmp_path, "run.rank3.json", {"rank": 3, "padding": "x" * 2000})
    _write(tmp_path, "run.rank4.json", {"rank": 4})
    (tmp_path / "run.rank5.json").mkdir()
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 1000)
    assert read_manifests(tmp_path) == [Manifest(rank=4)]
    assert read_manifests(tmp_path / "missing" / "deeper") == []


# -- manifest: the report's summary -------------------------------------------------------------------------


def test_the_summary_of_a_captured_manifest(tmp_path: Path) -> None:
    write_manifest(tmp_path / "run.json", _built())
    written = json.loads((tmp_path / "run.json").read_text())
    keys = ("torchscope_version", "torch_version", "command", "host", "world_size", "schedule", "activities",
            "options", "status", "start_time", "steps_seen", "errors", "environment")
    assert manifest_summary(read_manifests(tmp_path)) == {**{k: written[k] for k in keys}, "manifests": 1}


def test_the_summary_has_only_what_was_recorded(tmp_path: Path) -> None:
    _write(tmp_path, "run.json", {"activities": ["cpu", "cuda"], "environment": {"cudnn_benchmark": False}})
    assert manifest_summary(read_manifests(tmp_path)) == {
        "activities": ["cpu", "cuda"], "environment": {"cudnn_benchmark": False}, "manifests": 1,
    }
    assert manifest_summary([]) == {}


def test_the_summary_reports_every_rank_status(tmp_path: Path) -> None:
    for rank, status in enumerate(["complete", "interrupted", "complete"]):
        _write(tmp_path, f"run.rank{rank}.json", {"rank": rank, "world_size": 3, "status": status})
    _write(tmp_path, "run.rank3.json", {"rank": 3, "world_size": 3})
    summary = manifest_summary(read_manifests(tmp_path))
    assert summary == {"world_size": 3, "status": ["complete", "interrupted"], "manifests": 4}
