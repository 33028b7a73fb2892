"""PyTorch's own anti-pattern matcher (`torch.profiler._pattern_matcher`, "TorchTidy") and torchscope
on the same CPU trace with its patterns planted: every pattern the matcher finds, a finding names (but the two
whose fixes need a GPU's tensor cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchscope

torch = pytest.importorskip("torch")
pm = pytest.importorskip("torch.profiler._pattern_matcher")

# matcher pattern -> the finding that covers it (the CUDA-only ones cannot match on this CPU trace)
COVERED_BY = {
    "OptimizerSingleTensorPattern": "optimizer.step",
    "SynchronizedDataLoaderPattern": "data_loading.exposed",
    "GradNotSetToNonePattern": "optimizer.zero_grad_fill",
    "Conv2dBiasFollowedByBatchNorm2dPattern": "compute.conv_bias_before_batch_norm",
    "MatMulDimInFP16Pattern": "compute.half_matmul_misaligned",
    "FP32MatMulPattern": "compute.tensor_cores_unused",
    "ForLoopIndexingPattern": "host_overhead.indexing_loop",
    "ExtraCUDACopyPattern": "host_overhead.extra_device_copy",  # CUDA only: tests/unit/test_patterns.py
}
PLANTED = ("OptimizerSingleTensorPattern", "SynchronizedDataLoaderPattern", "GradNotSetToNonePattern",
           "Conv2dBiasFollowedByBatchNorm2dPattern", "MatMulDimInFP16Pattern", "ForLoopIndexingPattern")


class _NoSchedule:
    def step(self) -> None:
        """Marks nothing: without a schedule the trace is one window (torchscope reads it as one step)."""


def _train(prof: "torch.profiler.profile | _NoSchedule") -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, bias=True), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 16, 16), torch.randint(0, 10, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=0)
    half = torch.randn(20, 100, dtype=torch.bfloat16)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        torch.mm(half, half.t())  # a bf16 matmul with dimensions not multiples of 8
        scores = torch.empty(12)
        for i in range(12):  # element-by-element indexing in a Python loop
            scores[i] = i
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        prof.step()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple["torch.profiler.profile", Path]:
    folder = tmp_path_factory.mktemp("tidy")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True) as prof:
        _train(_NoSchedule())  # the matcher reads the profiler's last event tree: one window, no schedule
    trace = folder / "tidy.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    return prof, trace


def _matches(pattern: "pm.Pattern") -> int:
    """The matcher's count, skipping events whose name it cannot decode: in torch 2.x some Python-call
    names are read after they were freed (its own TODO in SynchronizedDataLoaderPattern.match), which
    raises UnicodeDecodeError mid-traversal."""
    count = 0
    for event in pattern.eventTreeTraversal():
        try:
            count += bool(pattern.match(event))
        except UnicodeDecodeError:
            continue
    return count


def test_we_find_at_least_what_the_pattern_matcher_finds(captured: tuple["torch.profiler.profile", Path]) -> None:
    prof, trace = captured
    report = torchscope.analyze(trace, jobs=1, use_cache=False)
    ours = {f.id for f in report.findings}
    matched = {name for name in COVERED_BY if _matches(getattr(pm, name)(prof))}
    assert set(PLANTED) <= matched, f"the matcher missed a planted pattern: {set(PLANTED) - matched}"
    # On a CPU trace the FP32 matmul pattern flags every float matmul; its fix (TF32) needs a CUDA GPU. The FP16
    # dimension pattern's fix is for tensor cores: counted, not reported on a CPU, where padding gains little
    # (this project's CPU ran a bf16 1020x1020x1024 matmul at 1478 GFLOP/s, a 1024-cube at 1502).
    assert report.measurements.patterns.half_matmuls_misaligned_per_step > 0
    matched -= {"FP32MatMulPattern", "MatMulDimInFP16Pattern"}
    missing = {name: COVERED_BY[name] for name in matched if COVERED_BY[name] not in ours}
    assert not missing, (missing, sorted(ours))
