"""Anti-patterns of PyTorch's own pattern matcher (`torch.profiler._pattern_matcher`) not covered by
another measurement, each found as the matcher defines it, vectorised over the host call tree:

* a convolution's bias right before a batch norm (the norm cancels it);
* FP16/BF16 matmuls whose dimensions are not multiples of 8 (tensor cores need them aligned), and the time
  of the half-precision matmul kernels (on a CPU without fast kernels for them, `compute.cpu_half_emulated`);
* for-loop indexing: among the children of one parent, a run of at least 10 repetitions of the same
  sequence of ops starting with `aten::select` (`for i in ...: t[i] = ...`), with the time it takes;
* an extra CUDA copy: `aten::to` -> `aten::_to_copy` -> `aten::copy_` of one dtype, right after a fill
  (`fill_`, `zero_`, `normal_`, `uniform_`): a tensor made on the CPU only to be copied to the device.

The others map to existing findings: num_workers=0 (`data_loading.exposed`), the single-tensor
optimizer (`optimizer.step` with a for-loop), gradients not set to None (`optimizer.zero_grad_fill`),
FP32 matmuls with TF32 off (`compute.tensor_cores_unused`, GPU).
"""

from __future__ import annotations

from typing import Callable

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.flops import event_flops
from torchscope.analysis.span import SpanInput
from torchscope.analysis.nesting import HostTree
from torchscope.analysis.steps import event_steps, main_thread_mask
from torchscope.arrays import group_ids
from torchscope.report.measurements import Patterns
from torchscope.trace.kinds import DEVICE_KINDS, Kind
from torchscope.trace.tables import EventTable

CONV_OPS = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution"})
HALF_TYPES = ("c10::Half", "c10::BFloat16", "Half", "BFloat16")
INIT_OPS = frozenset({"aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_"})
MIN_LOOP_REPEATS = 10  # the matcher's threshold
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})
# The ops that do a matmul's math (aten::linear and aten::matmul call them; autocast's outer aten::linear
# still shows float32 inputs, these show the dtype the math runs in).
MATMUL_KERNEL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
RECURRENT_CELLS = frozenset({"aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"})


def _has_bias(dims: str) -> bool:
    try:
        shapes = msgspec.json.decode(dims)
    except (msgspec.DecodeError, ValueError):
        return False
    return isinstance(shapes, list) and len(shapes) > 2 and isinstance(shapes[2], list) and len(shapes[2]) > 0


def _misaligned(dims: str) -> bool:
    try:
        shapes = msgspec.json.decode(dims)
    except (msgspec.DecodeError, ValueError):
        return False
    matrices = [s for s in shapes if isinstance(s, list) and len(s) >= 2] if isinstance(shapes, list) else []
    return any(d % 8 for s in matrices for d in s[-2:] if isinstance(d, int))


def input_shapes(text: str) -> list[list[int]] | None:
    """An op's recorded input shapes (`[[1000000, 64], [512, 4], [], ...]`; a non-tensor input is []), or
    None when the text is no such list."""
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    if not isinstance(value, list):
        return None
    return [[int(d) for d in s] if isinstance(s, list) and all(isinstance(d, int) for d in s) else [] for s in value]


def by_dims_and_types(events: EventTable, rows: np.ndarray, test: Callable[[str, str], bool]) -> np.ndarray:
    """Per row: `test(dims, types)` on the op's recorded input dims and types, run once per distinct pair
    (usually a handful among thousands of ops)."""
    # (dims, types) as one int64 (string ids < 2**31): a 1-d grouping, not np.unique(axis=0) on a stack.
    key = (events.input_dims[rows].astype(np.int64) << 32) | events.input_type[rows].astype(np.int64)
    unique, inverse = np.unique(key, return_inverse=True)
    strings = events.strings
    values = np.fromiter((test(strings[k >> 32], strings[k & 0xFFFFFFFF]) for k in unique.tolist()), bool, unique.size)
    return values[inverse.reshape(-1)]


def _by_shapes(events: EventTable, rows: np.ndarray, named: Callable[[str], bool], test: Callable[[str, str], bool]) -> np.ndarray:
    """Per row: `named(name)` holds and `test(dims, types)` holds (`by_dims_and_types` on the rows so named)."""
    result = np.zeros(rows.size, dtype=bool)
    chosen = np.flatnonzero(events.name_mask(named, rows))
    if chosen.size:
        result[chosen] = by_dims_and_types(events, rows[chosen], test)
    return result


# Named predicates, not lambdas: `EventTable.name_mask` keeps a named function's answers per string.
def _is_conv(name: str) -> bool:
    return name in CONV_OPS


def _is_matmul(name: str) -> bool:
    return name in MATMUL_OPS


def _is_init(name: str) -> bool:
    return name in INIT_OPS


def _is_recurrent_cell(name: str) -> bool:
    return name in RECURRENT_CELLS


def _is_select(name: str) -> bool:
    return name == "aten::select"


def _is_copy(name: str) -> bool:
    return name == "aten::copy_"


def _is_to_copy(name: str) -> bool:
    return name == "aten::_to_copy"


def _is_to(name: str) -> bool:
    return name == "aten::to"


def _is_batch_norm(name: str) -> bool:
    return name == "aten::batch_norm"


def _is_add_(name: str) -> bool:
    return name == "aten::add_"


def for_loop_indexing(events: EventTable, tree: HostTree) -> tuple[np.ndarray, np.ndarray]:
    """The first events (aten::select) of the loop iterations found, and each iteration's duration.

    Siblings (children of one parent, or one thread's roots) in start order are cut into segments at
    each aten::select; a segment is identified by its length and an order-sensitive hash of its names
    (sum of a random value per name times its position, in wrapping uint64), and runs of at least
    MIN_LOOP_REPEATS equal consecutive segments are loops. Only parents with a select child are looked at."""
    empty = np.zeros(0, dtype=np.int64), np.zeros(0)
    selects = np.flatnonzero(events.name_mask(_is_select) & (tree.depth >= 0))
    if selects.size < MIN_LOOP_REPEATS:
        return empty
    thread = (events.pid.astype(np.int64) << 32) | events.tid.astype(np.int64)
    # A sibling group: the parent, or for roots the thread (negative, so never an event index).
    group_of = np.where(tree.parent >= 0, tree.parent.astype(np.int64), -1 - (thread & 0x7FFFFFFFFFFF))
    nodes = np.flatnonzero((tree.depth >= 0) & np.isin(group_of, group_of[selects]))
    nodes = nodes[np.lexsort((events.ts_us[nodes], group_of[nodes]))]
    group = group_of[nodes]
    is_select = np.isin(nodes, selects)
    new_group = np.ones(nodes.size, dtype=bool)
    new_group[1:] = group[1:] != group[:-1]
    starts = np.flatnonzero(is_select | new_group)
    ends = np.append(starts[1:], nodes.size)
    # Order-sensitive hash: value(name) x (position in the segment + 1), summed in wrapping uint64.
    value = (events.name[nodes].astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    value ^= value >> np.uint64(29)
    position = np.arange(nodes.size) - np.repeat(starts, ends - starts) + 1
    with np.errstate(over="ignore"):
        running = np.cumsum(value * position.astype(np.uint64))
        before = np.where(starts > 0, running[np.maximum(starts - 1, 0)], np.uint64(0))
        digest = running[ends - 1] - before
    length = ends - starts
    valid = is_select[starts]
    previous_ok = np.zeros(starts.size, dtype=bool)
    previous_ok[1:] = valid[1:] & valid[:-1] & (group[starts[1:]] == group[starts[:-1]])
    same = np.zeros(starts.size, dtype=bool)
    same[1:] = previous_ok[1:] & (digest[1:] == digest[:-1]) & (length[1:] == length[:-1])
    # A loop's last iteration runs on into whatever follows it (up to the next select or the end of the
    # siblings): it repeats the loop if its first ops do, as the matcher compares them.
    kept = length.copy()
    tail = np.zeros(starts.size, dtype=bool)
    tail[1:] = previous_ok[1:] & ~same[1:] & (length[1:] > length[:-1])
    at = np.flatnonzero(tail)
    with np.errstate(over="ignore"):
        prefix = running[starts[at] + length[at - 1] - 1] - before[at]
    tail[at] = prefix == digest[at - 1]
    kept[tail] = length[np.flatnonzero(tail) - 1]
    same |= tail
    run = np.cumsum(~same)
    run_length = np.bincount(run)[run]
    looped = valid & (run_length >= MIN_LOOP_REPEATS)
    elapsed = np.concatenate(([0.0], np.cumsum(events.dur_us[nodes])))  # siblings do not overlap
    durations = elapsed[starts + kept] - elapsed[starts]
    return nodes[starts[looped]], durations[looped]


def extra_device_copies(events: EventTable, tree: HostTree) -> np.ndarray:
    """The `aten::to` events that copy, at one dtype, a tensor filled just before (see the module doc)."""
    copies = np.flatnonzero(events.name_mask(_is_copy))
    to_copy = tree.parent[copies]
    copies, to_copy = copies[to_copy >= 0], to_copy[to_copy >= 0]
    keep = events.name_mask(_is_to_copy, to_copy)
    copies, to_copy = copies[keep], to_copy[keep]
    to = tree.parent[to_copy]
    keep = to >= 0
    copies, to = copies[keep], to[keep]
    keep = events.name_mask(_is_to, to) & _by_shapes(events, copies, _is_copy, _copies_one_dtype)
    to = to[keep]
    if to.size == 0:
        return to
    # The op started last before each `to` on its thread and already ended: the matcher's previous leaf.
    ops = events.kind_rows(Kind.CPU_OP)
    thread = events.thread_keys(ops)
    order = np.lexsort((events.ts_us[ops], thread))
    ops, thread = ops[order], thread[order]
    rank = np.empty(events.kind.size, dtype=np.int64)
    rank[ops] = np.arange(ops.size)
    before = rank[to] - 1
    ok = before >= 0
    ok &= thread[np.maximum(before, 0)] == events.thread_keys(to)
    previous = ops[np.maximum(before, 0)]
    ok &= events.ts_us[previous] + events.dur_us[previous] <= events.ts_us[to]
    ok &= events.name_mask(_is_init, previous)
    return to[ok]


def _conv_with_bias(dims: str, types: str) -> bool:
    return _has_bias(dims)


def _half_misaligned(dims: str, types: str) -> bool:
    return _half(dims, types) and _misaligned(dims)


def _half(dims: str, types: str) -> bool:
    return any(t in types for t in HALF_TYPES)


def _half_matmul_kernels(events: EventTable, ops: np.ndarray, n: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per step, by the dtype they compute in, the host time and GFLOPs of the matmul kernels' ops among `ops`.
    CPU traces only: on a GPU the host time of these ops is their launch, not their math."""
    if events.kind_rows(DEVICE_KINDS).size:
        return {}, {}
    kernels = ops[events.name_mask(_is_matmul_kernel, ops)]
    attention = ops[events.name_mask(_is_cpu_attention, ops)]
    us: dict[str, float] = {}
    gflop: dict[str, float] = {}
    for dtype, test in (("bfloat16", _first_input_bf16), ("float16", _first_input_fp16)):
        rows = kernels[by_dims_and_types(events, kernels, test)]
        fused = attention[by_dims_and_types(events, attention, test)]
        if rows.size or fused.size:
            us[dtype] = float((events.dur_us[rows].sum() + events.dur_us[fused].sum()) / n)
            flops = np.nansum(event_flops(events, rows)) + np.nansum(_attention_flops(events, fused))
            gflop[dtype] = float(flops / n / 1e9)
    return us, gflop


# SDPA's CPU kernels (the flash-attention loop, forward and backward): their matmuls run in ATen's CPU gemm,
# which in bfloat16 falls back to scalar code as mm does (B=4, H=8, L=256, E=64 on an AVX2 CPU: 112 ms a
# forward and backward in bfloat16, 25 ms in float32).
# Per kernel: (the FLOPs' multiple of B H L S (E + Ev), the positions of query, key and value among its inputs).
_CPU_ATTENTION = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": (2.0, 0),  # Q K^T and P V: 2 B H L S E + 2 B H L S Ev
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (5.0, 1),  # 2.5x (FlashAttention); grad_out first
}


def _is_cpu_attention(name: str) -> bool:
    return name in _CPU_ATTENTION


def _attention_flops(events: EventTable, rows: np.ndarray) -> np.ndarray:
    """FLOPs of SDPA CPU kernels from query [B, H, L, E], key [B, Hk, S, E] and value [B, Hk, S, Ev] (the
    backward's inputs start with the output's gradient), without the causal mask's savings (unknown from the
    shapes: the float32 estimate is an upper bound); NaN where the shapes are not recorded."""
    key = (events.name[rows].astype(np.int64) << 32) | events.input_dims[rows].astype(np.int64)
    unique, inverse = np.unique(key, return_inverse=True)  # a few distinct (kernel, shapes) pairs
    strings = events.strings
    per_key = np.full(unique.size, np.nan)
    for i, k in enumerate(unique.tolist()):
        try:
            multiple, first = _CPU_ATTENTION[strings[k >> 32]]
            shapes = msgspec.json.decode(strings[k & 0xFFFFFFFF])
            (b, h, l, e), (_, _, s, _), (_, _, _, ev) = shapes[first:first + 3]
            per_key[i] = multiple * b * h * l * s * (e + ev)
        except (msgspec.DecodeError, ValueError, TypeError, IndexError, KeyError):
            continue
    return per_key[inverse.reshape(-1)]


def _is_matmul_kernel(name: str) -> bool:
    return name in MATMUL_KERNEL_OPS


def _first_input_bf16(dims: str, types: str) -> bool:
    return "BFloat16" in types.split(",", 1)[0]


def _first_input_fp16(dims: str, types: str) -> bool:
    first = types.split(",", 1)[0]
    return "Half" in first and "BFloat16" not in first


def _copies_one_dtype(dims: str, types: str) -> bool:
    return _same_dtypes(types)


def _same_dtypes(types: str) -> bool:
    try:
        parsed = msgspec.json.decode(types)
    except (msgspec.DecodeError, ValueError):
        return False
    return isinstance(parsed, list) and len(parsed) >= 2 and bool(parsed[0]) and parsed[0] == parsed[1]


def patterns(span: SpanInput) -> Patterns:
    """The per-step counts of the matcher patterns measured here."""
    events, steps = span.events, span.steps
    n = max(len(steps), 1)
    in_steps = event_steps(events, steps) >= 0
    ops = np.flatnonzero(span.times.op_mask & main_thread_mask(events) & in_steps)
    outermost = ops[span.times.launching_op[np.maximum(span.tree.parent[ops], 0)] < 0] if ops.size else ops
    outermost = outermost[np.argsort(events.ts_us[outermost], kind="stable")]
    if outermost.size < 1:
        return Patterns()
    conv = _by_shapes(events, outermost, _is_conv, _conv_with_bias)
    # The next op, or the one after a BatchNorm's `num_batches_tracked += 1` (training mode).
    is_bn = np.append(events.name_mask(_is_batch_norm, outermost), [False, False])
    is_add = np.append(events.name_mask(_is_add_, outermost)[1:], False)
    followed_by_bn = is_bn[1:-1] | (is_add & is_bn[2:])
    half = _by_shapes(events, outermost, _is_matmul, _half)
    half_us, half_gflop = _half_matmul_kernels(events, ops, n)
    half_misaligned = _by_shapes(events, outermost[half], _is_matmul, _half_misaligned)
    loop_starts, loop_us = for_loop_indexing(events, span.tree)
    looped = in_steps[loop_starts]
    # The iterations' share inside forward/backward: only that part can batching the model save (the rule's cap).
    begin = events.ts_us[loop_starts[looped]]
    in_compute = intervals.overlap_per_window(span.compute_set, begin, begin + loop_us[looped])
    fraction = np.divide(in_compute, loop_us[looped], out=np.zeros(in_compute.size), where=loop_us[looped] > 0)
    copies = extra_device_copies(events, span.tree)
    cells = outermost[events.name_mask(_is_recurrent_cell, outermost)]
    cell_names, cell_slot = group_ids(events.name[cells])
    cell = events.strings[int(cell_names[np.argmax(np.bincount(cell_slot))])] if cells.size else ""
    return Patterns(
        conv_bias_before_batch_norm_per_step=float((conv & followed_by_bn).sum() / n),
        half_matmuls_misaligned_per_step=float(half_misaligned.sum() / n),
        half_matmuls_per_step=float(half.sum() / n),
        half_matmul_us_per_step=half_us,
        half_matmul_gflop_per_step=half_gflop,
        indexing_loop_iterations_per_step=float(looped.sum() / n),
        indexing_loop_us_per_step=float(loop_us[looped].sum() / n),
        indexing_loop_compute_us_per_step=float((loop_us[looped] * fraction).sum() / n),
        extra_device_copies_per_step=float(in_steps[copies].sum() / n),
        extra_device_copy_us_per_step=float(events.dur_us[copies[in_steps[copies]]].sum() / n),
        recurrent_cells_per_step=float(cells.size / n),
        recurrent_cell=cell,
    )
