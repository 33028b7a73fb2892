"""JSON-facing display fixes of issue 13: `run.trace_files` relative to the folder analysed whether the
tables come from the cache or not, and names and shapes never truncated in the JSON."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgspec
import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.pipeline.analyze import analyze

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "resnet50_num_workers_0"


def test_trace_files_are_relative_to_the_run_directory_cache_or_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for trace in TRACE.glob("*.json.gz"):
        shutil.copy(trace, run_dir)
    names = sorted(p.name for p in run_dir.glob("*.json.gz"))
    monkeypatch.chdir(tmp_path)
    seen = [analyze("run").run.trace_files]  # relative input, fills the cache
    monkeypatch.chdir("/")
    seen.append(analyze(str(run_dir)).run.trace_files)  # absolute input, from the cache
    seen.append(analyze(str(run_dir), use_cache=False).run.trace_files)
    seen.append(analyze(str(run_dir / names[0])).run.trace_files)  # one file given: its name
    assert seen == [names, names, names, names[:1]]


def test_long_names_and_shapes_are_whole_in_the_json(tmp_path: Path) -> None:
    name = "aten::" + "very_long_operator_name_" * 8
    shapes = [[16, 3, 224, 224]] * 12
    b = TraceBuilder()
    for i, t0 in enumerate((0.0, 100.0, 200.0)):
        b.step(i + 1, t0, 100)
        b.op(name, t0 + 10, 50, **{"Input Dims": shapes})
        b.annotation("## " + "a long user range name " * 6 + "##", t0 + 10, 60)
    path = b.write(tmp_path / "long.pt.trace.json")
    report = json.loads(msgspec.json.encode(analyze(str(path), use_cache=False)))
    assert name in {row["name"] for row in report["operators"]}
    shape_text = next(row["input_shapes"] for row in report["operators_by_shape"] if row["name"] == name)
    assert json.loads(shape_text) == shapes
    assert any(len(row["name"]) > 140 for row in report["ranges"])
