"""The benchmark tooling works: generated traces are valid, deterministic Kineto JSON that torchscope
analyses, and `benchmarks/run.py` prints its table (tiny sizes, without HTA or the floor: no installs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generate_module():
    spec = importlib.util.spec_from_file_location("bench_generate", REPO / "benchmarks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_generate"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_traces_are_deterministic_and_analysable(tmp_path: Path) -> None:
    generate = _generate_module()
    paths = generate.generate(tmp_path / "a", size_mb=2, ranks=2, steps=3, jobs=1, quiet=True)
    assert [p.name for p in paths] == [generate.trace_name(0), generate.trace_name(1)]
    doc = json.loads(paths[1].read_text())
    assert doc["distributedInfo"]["rank"] == 1 and doc["distributedInfo"]["world_size"] == 2
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert {"cpu_op", "python_function", "cuda_runtime", "kernel", "gpu_memcpy", "ac2g", "fwdbwd",
            "cpu_instant_event", "user_annotation"} <= cats
    again = generate.generate(tmp_path / "b", size_mb=2, ranks=2, steps=3, jobs=1, quiet=True)
    assert again[0].read_bytes() == paths[0].read_bytes()

    import torchscope

    report = torchscope.analyze(tmp_path / "a", jobs=1, use_cache=False)
    assert len(report.steps) == 6
    assert sorted(report.run.ranks) == [0, 1]


def test_run_prints_the_side_by_side_table(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--sizes", "2mb", "--skip-hta", "--skip-floor",
         "--data-dir", str(tmp_path / "data"), "--output", str(tmp_path / "results.md")],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "| 2mb | 2 MB |" in result.stdout
    assert "cached re-analysis" in result.stdout
    assert (tmp_path / "results.md").read_text().startswith("# torchscope benchmark results")


def test_no_benchmark_script_shadows_a_module_the_children_import() -> None:
    """`python benchmarks/X.py` puts benchmarks/ first on sys.path, so a script named like a standard-library
    module or an anchor's package replaces it in every benchmark child: `benchmarks/html.py` did, and HTA's
    load died on `import html.entities` (networkx), so `make bench` measured no HTA at all."""
    anchors = {"hta", "orjson", "dask", "distributed", "ray", "numpy", "pandas", "networkx", "msgspec", "torchscope"}
    scripts = {path.stem for path in (REPO / "benchmarks").glob("*.py")}
    assert scripts, "no benchmark scripts found"
    assert not scripts & (set(sys.stdlib_module_names) | anchors)
