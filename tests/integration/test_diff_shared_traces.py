"""`diff` of the two real ResNet-50 GPU trace folders in ../shared/traces (DataLoader num_workers 0 vs 4,
two spans each): the exposed data loading nearly vanishes. Skipped only where ../shared is absent."""

from __future__ import annotations

from pathlib import Path

from torchscope.pipeline.diff import diff_reports, load_report
from torchscope.pipeline.gate import evaluate, parse_threshold


def test_more_workers_on_the_shared_gpu_traces_drop_the_data_loading_share(shared_traces: Path) -> None:
    base = load_report(shared_traces / "gpu" / "resnet50_num_workers_0", use_cache=False)
    new = load_report(shared_traces / "gpu" / "resnet50_num_workers_4", use_cache=False)
    diff = diff_reports(base, new)
    assert diff.base.steps == diff.new.steps == 12  # ProfilerStep#5-#10 and #16-#21 of each folder
    data = {c.category: c for c in diff.breakdown}["data_loading"]
    # The TensorBoard plugin's DataLoader share on the same files (traces/README.md): 33.4 and 22.9 %
    # of the step for num_workers=0's two spans, 0.8 and 0.2 % for num_workers=4's.
    assert 22 < data.base_percent < 34 and data.new_percent < 1.5, data
    assert data.change_pp < -20 and data.new_us < 0.05 * data.base_us
    metric = next(m for m in diff.metrics if m.name == "breakdown.data_loading_us")
    assert metric.significant and metric.verdict == "better"  # beyond the steps' noise, not just smaller
    exposed = next(f for f in diff.findings if f.id == "data_loading.exposed")
    assert exposed.base_share is not None and exposed.new_share is not None and exposed.new_share < 0.1 * exposed.base_share
    # The gate on the data-loading share: passes this way round, fails the other (num_workers 4 -> 0).
    share = [parse_threshold("data_loading+2pp")]
    assert not evaluate(diff, None, share).failed
    back = evaluate(diff_reports(new, base), None, share)
    assert back.failed and "data_loading share" in back.explanation and "beyond noise), limit +2 pp" in back.explanation
