"""Device-side analyses: kernel table, utilisation, estimated SM efficiency and occupancy, tensor cores,
and idle gaps with what the host was doing meanwhile.

Formulas follow the TensorBoard plugin (gpu_metrics_parser.py) where it defined one:
* utilisation = busy time (union of kernels) inside the step windows / window time, averaged over devices;
* est. SM efficiency = sum(min(blocks per SM, 1) x kernel time) / window time (per-kernel, not per-segment);
* est. achieved occupancy = kernel-time-weighted mean of `est. achieved occupancy %`;
* tensor-core share = time of kernels whose names match tensor-core patterns / all kernel time; eligible
  share = kernel time launched under tensor-core-eligible ops (GEMM, convolution, their backward) / kernel
  time launched under any op.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.frames import readable_totals
from torchscope.analysis.nesting import HostTree, launcher_of_device_events, nearest_ancestor_of
from torchscope.analysis.operators import OpTimes
from torchscope.analysis.steps import StepWindows
from torchscope.arrays import distinct, group_ids, median
from torchscope.report.model import DeviceSummary, KernelRow
from torchscope.trace.kinds import DEVICE_KINDS, Kind
from torchscope.trace.tables import EventTable

# TensorBoard plugin allowlist (tensor_core.py) plus names of Ampere/Hopper-era GEMM kernels.
TENSOR_CORE_PATTERNS = (
    "h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816", "c1688", "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group", "xmma_implicit_gemm",
    "xmma_sparse_conv", "xmma_warp_specialized_implicit_gemm", "xmma_gemm", "xmma_sparse_gemm",
    "tensorop", "wgmma", "nvjet", "_tf32", "bf16gemm", "hgemm", "f16gemm", "mma_",
)  # fmt: skip
_ELIGIBLE_OPS = re.compile(
    r"^aten::(_?convolution\w*|conv\d?d|conv_tbc|conv_transpose\d?d|cudnn_convolution\w*|mkldnn_convolution|"
    r"mm|addmm|addmm_|bmm|baddbmm|addbmm|addmv|mv|addr|matmul|linear|_scaled_mm|prelu|"
    r"_thnn_fused_(lstm|gru)_cell|(lstm|gru|rnn_tanh|rnn_relu)_cell|chain_matmul|linalg_multi_dot)$"
)
_ELIGIBLE_BACKWARD = re.compile(r"(Convolution\w*|Mm|Addmm|Bmm|Baddbmm|Addbmm|Addmv|Mv|Linear)Backward\d*$")


def is_tensor_core_kernel(name: str) -> bool:
    lowered = name.lower()
    return any(p in lowered for p in TENSOR_CORE_PATTERNS)


def is_tensor_core_eligible_op(name: str) -> bool:
    return bool(_ELIGIBLE_OPS.match(name) or _ELIGIBLE_BACKWARD.search(name))


class DeviceActivity(msgspec.Struct, frozen=True):
    kernel_rows: list[KernelRow]
    summary: DeviceSummary
    busy: intervals.IntervalSet
    idle_us_per_step: np.ndarray
    gap_host_ops: dict[str, float]  # host op name -> self time (us/step) spent while the device idled


def analyze_device(
    events: EventTable, steps: StepWindows, times: OpTimes, tree: HostTree, header: dict
) -> DeviceActivity:
    kernels = events.kind_rows(Kind.KERNEL)
    device_events = events.kind_mask(DEVICE_KINDS)
    summary = _device_properties(header)
    n_steps = max(len(steps), 1)
    windows = intervals.union(steps.start_us, steps.end_us)
    window_us = intervals.total_length(windows)
    busy = intervals.union(events.ts_us[device_events], events.ts_us[device_events] + events.dur_us[device_events])
    idle_per_step = steps.duration_us - intervals.overlap_per_window(busy, steps.start_us, steps.end_us)
    if kernels.size == 0 and not device_events.any():
        return DeviceActivity([], summary, busy, np.zeros(len(steps)), {})
    summary.present = True
    k_start = events.ts_us[kernels]
    k_end = k_start + events.dur_us[kernels]
    in_window = intervals.overlap_per_window(windows, k_start, k_end)
    summary.utilization = _utilization(events, kernels, steps, window_us)
    blocks = events.blocks_per_sm[kernels]
    has_blocks = np.isfinite(blocks) & (blocks >= 0)
    if window_us and has_blocks.any():  # without `blocks per SM` in the trace the figure is unknown, not 0
        summary.sm_efficiency = float(np.sum(np.clip(blocks[has_blocks], 0, 1) * in_window[has_blocks]) / window_us)
    occ = events.occupancy_pct[kernels]
    has_occ = np.isfinite(occ) & (occ >= 0) & (in_window > 0)
    if has_occ.any():
        summary.achieved_occupancy_pct = float(np.average(occ[has_occ], weights=in_window[has_occ]))
    tc_kernel = events.name_mask(is_tensor_core_kernel, kernels)
    kernel_op = _launching_op(events, kernels, times)
    kernel_time = float(events.dur_us[kernels].sum())
    if kernel_time > 0:
        summary.tensor_core_kernel_share = float(events.dur_us[kernels][tc_kernel].sum() / kernel_time)
        summary.tensor_core_eligible_share = _eligible_share(events, kernels, kernel_op, times, tree)
    summary.kernels_per_step = float(np.count_nonzero(in_window > 0) / n_steps)
    summary.median_kernel_us = float(median(events.dur_us[kernels])) if kernels.size else None
    rows = _kernel_rows(events, kernels, tc_kernel, kernel_op)
    gaps = intervals.subtract(windows, busy)
    return DeviceActivity(rows, summary, busy, idle_per_step, _host_ops_during(events, times, gaps, n_steps))


def _device_properties(header: dict) -> DeviceSummary:
    summary = DeviceSummary()
    props = header.get("deviceProperties") or header.get("computeProperties") or []
    if isinstance(props, list) and props and isinstance(props[0], dict):
        first = props[0]
        summary.name = str(first.get("name", ""))
        if "computeMajor" in first:
            summary.compute_capability = f"{first.get('computeMajor')}.{first.get('computeMinor', 0)}"
        total = first.get("totalGlobalMem")
        summary.total_memory_bytes = int(total) if isinstance(total, (int, float)) else None
        for prop in props:  # a process sees every GPU of its node: each capacity under its own id
            if isinstance(prop, dict) and isinstance(prop.get("id"), int) and isinstance(prop.get("totalGlobalMem"), (int, float)):
                summary.memory_bytes_by_id[prop["id"]] = int(prop["totalGlobalMem"])
    return summary


def _utilization(events: EventTable, kernels: np.ndarray, steps: StepWindows, window_us: float) -> float | None:
    if window_us <= 0:
        return None
    devices = events.device[kernels]
    shares = []
    for device in distinct(devices):
        mine = kernels[devices == device]
        busy = intervals.union(events.ts_us[mine], events.ts_us[mine] + events.dur_us[mine])
        shares.append(intervals.overlap_per_window(busy, steps.start_us, steps.end_us).sum() / window_us)
    return float(np.mean(shares))


def _launching_op(events: EventTable, kernels: np.ndarray, times: OpTimes) -> np.ndarray:
    """The CPU op under which each kernel was launched (-1 if none)."""
    launcher = launcher_of_device_events(events, kernels)
    return np.where(launcher >= 0, times.launching_op[np.maximum(launcher, 0)], -1)


def _eligible_share(events: EventTable, kernels: np.ndarray, op: np.ndarray, times: OpTimes, tree: HostTree) -> float | None:
    attached = op >= 0
    if not attached.any():
        return None
    # A kernel counts as eligible when its launching op or any op enclosing it is eligible (autograd and
    # aten wrappers nest the GEMM/convolution op: aten::linear > aten::addmm > kernel).
    eligible_op = times.op_mask & events.name_mask(is_tensor_core_eligible_op)
    under_eligible = nearest_ancestor_of(tree, eligible_op) >= 0
    eligible = attached & under_eligible[np.maximum(op, 0)]
    dur = events.dur_us[kernels]
    return float(dur[eligible].sum() / dur[attached].sum())


def _kernel_rows(events: EventTable, kernels: np.ndarray, tc_kernel: np.ndarray, op: np.ndarray) -> list[KernelRow]:
    names, group = group_ids(events.name[kernels])
    dur = events.dur_us[kernels]
    calls = np.bincount(group, minlength=names.size)
    total = np.bincount(group, dur, names.size)
    minimum = np.full(names.size, np.inf)
    maximum = np.zeros(names.size)
    np.minimum.at(minimum, group, dur)
    np.maximum.at(maximum, group, dur)
    occ = events.occupancy_pct[kernels]
    blocks = events.blocks_per_sm[kernels]
    valid_occ = np.isfinite(occ) & (occ >= 0)
    occ_weight = np.bincount(group[valid_occ], dur[valid_occ], names.size)
    occ_sum = np.bincount(group[valid_occ], (occ * dur)[valid_occ], names.size)
    valid_blocks = np.isfinite(blocks)
    blocks_count = np.bincount(group[valid_blocks], minlength=names.size)
    blocks_sum = np.bincount(group[valid_blocks], blocks[valid_blocks], names.size)
    tensor_core = np.bincount(group[tc_kernel], minlength=names.size) > 0
    launched_by = _most_common_launcher(events, group[op >= 0], op[op >= 0], names.size)
    rows = []
    for g, name_id in enumerate(names.tolist()):
        rows.append(
            KernelRow(
                name=events.strings[name_id],
                calls=int(calls[g]),
                total_us=float(total[g]),
                mean_us=float(total[g] / calls[g]),
                min_us=float(minimum[g]),
                max_us=float(maximum[g]),
                mean_occupancy_pct=float(occ_sum[g] / occ_weight[g]) if occ_weight[g] > 0 else None,
                mean_blocks_per_sm=float(blocks_sum[g] / blocks_count[g]) if blocks_count[g] else None,
                tensor_core=bool(tensor_core[g]),
                launched_by=events.strings[launched_by[g]] if launched_by[g] >= 0 else "",
            )
        )
    return sorted(rows, key=lambda r: -r.total_us)


def _most_common_launcher(events: EventTable, group: np.ndarray, op: np.ndarray, n_groups: int) -> np.ndarray:
    """Per kernel name (group): the name id of the op that launched most of its kernels (the lowest id
    among ties), -1 if none was launched under an op. All groups at once: one count per (group, op name)."""
    best = np.full(n_groups, -1, dtype=np.int64)
    if group.size == 0:
        return best
    pairs, counts = np.unique((group.astype(np.int64) << 32) | events.name[op], return_counts=True)
    pair_group = pairs >> 32
    # Within each group: most calls first, then (a stable sort of the ascending pairs) the lowest name id.
    order = np.lexsort((-counts, pair_group))
    first = order[np.r_[True, pair_group[order][1:] != pair_group[order][:-1]]]
    best[pair_group[first]] = pairs[first] & 0xFFFFFFFF
    return best


def _host_ops_during(
    events: EventTable, times: OpTimes, gaps: intervals.IntervalSet, n_steps: int
) -> dict[str, float]:
    """Host self time spent inside device-idle gaps, by op name (us per step), largest first."""
    host = np.flatnonzero(times.op_mask | events.kind_mask((Kind.RUNTIME, Kind.DRIVER)))
    if host.size == 0 or gaps[0].size == 0:
        return {}
    start = events.ts_us[host]
    dur = events.dur_us[host]
    overlap = intervals.overlap_per_window_sparse(gaps, start, start + dur)  # most host events miss the gaps
    self_share = np.divide(times.host_self_us[host], dur, out=np.zeros_like(dur), where=dur > 0)
    weight = overlap * np.clip(self_share, 0, 1)
    names, group = group_ids(events.name[host])
    totals = np.bincount(group, weight, names.size) / n_steps
    top = np.argsort(-totals)[:10]
    return readable_totals({events.strings[int(names[i])]: float(totals[i]) for i in top if totals[i] > 0})
