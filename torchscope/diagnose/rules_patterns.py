"""Rules for the pattern matcher's loop and copy anti-patterns (measured in analysis/patterns.py): a
Python for-loop that indexes a tensor element by element, and tensors filled on the CPU only to be copied
to the device."""

from __future__ import annotations

from typing import Optional

from torchscope.diagnose.context import Context, ms
from torchscope.diagnose.rules_host import batching_applies, calls_model_per_element, dispatch_saving, loop_in_model_us
from torchscope.diagnose.rule import Threshold, Verdict, by_share, rule
from torchscope.report.model import Fix

# What a vectorised replacement keeps of the loop's host time: one op instead of N iterations
# (pessimistic 25 %: the op itself on larger data; optimistic 2 %).
LOOP_KEPT = (0.25, 0.02)

INDEXING_LOOP = Threshold(0, "any run of >= 10 iterations of select-led ops (torch.profiler `_pattern_matcher` ForLoopIndexingPattern)")


@rule(
    "host_overhead.indexing_loop",
    "host_overhead",
    INDEXING_LOOP,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="indexing loop",
            value="t[idx] = values  /  torch.index_select, torch.gather, torch.where, masks",
            summary="one vectorised op instead of one small op per element",
        ),
        Fix(
            kind="code_change",
            target="nn.LSTM",
            value="output, (h, c) = nn.LSTM(input_size, hidden_size)(x)  # x: (time, batch, features)",
            summary="run the recurrence over the whole sequence in one call (nn.LSTM, nn.GRU, nn.RNN) instead of a "
            "cell per time step from Python",
        ),
    ),
)
def host_overhead_indexing_loop(ctx: Context) -> Optional[Verdict]:
    """A Python loop indexing a tensor one element at a time (costed by the loop's host time, less what
    a vectorised op keeps). Where the loop calls a recurrent cell per time step (nn.LSTMCell over a
    sequence) each iteration needs the previous one's state: no indexing op replaces it, a sequence-level
    recurrent module does."""
    patterns = ctx.report.measurements.patterns
    iterations = patterns.indexing_loop_iterations_per_step
    if iterations <= INDEXING_LOOP.value:
        return None
    loop_us = patterns.indexing_loop_us_per_step
    low, high = (ctx.share(loop_us * (1.0 - kept)) for kept in LOOP_KEPT)
    batched = dispatch_saving(ctx)
    if batched is not None:
        # Inside forward/backward, vectorising the loop saves at most what batching the whole forward and
        # backward saves, which keeps the arithmetic (a loop over chunks of large matmuls keeps most of its
        # time). The rest of the loop (data preparation, metrics) is not batching's to cap.
        if batching_applies(ctx) and calls_model_per_element(ctx):
            return None  # the loop calls the model element by element: host_overhead.dispatch costs batching it
        inside = loop_in_model_us(ctx)
        low, high = (
            min(ctx.share(inside * (1.0 - kept)), cap) + ctx.share((loop_us - inside) * (1.0 - kept))
            for kept, cap in zip(LOOP_KEPT, batched[1])
        )
    where = "host time, hidden where the device is busy" if ctx.has_device else "main-thread time"
    evidence = {"indexing_loop_iterations_per_step": iterations, "indexing_loop_us_per_step": loop_us}
    if patterns.recurrent_cells_per_step >= MIN_RECURRENT_STEPS:
        cell = patterns.recurrent_cell
        module = _SEQUENCE_MODULES.get(cell, "nn.LSTM")
        return Verdict(
            title=f"A Python loop runs a recurrent cell ({cell}) one time step at a time: {patterns.recurrent_cells_per_step:.0f} "
            f"calls per step, {ms(loop_us)} ({where})",
            share=(low + high) / 2.0,
            share_range=(low, high),
            evidence={**evidence, "recurrent_cells_per_step": patterns.recurrent_cells_per_step, "recurrent_cell": cell},
            recommendation=f"Each iteration needs the previous hidden state, so no indexing op replaces the loop: run the "
            f"whole sequence through {module} (one call that projects the inputs of all time steps at once and loops in "
            "C++, with cuDNN's fused kernels on a GPU), or torch.compile the loop.",
            fix_values={"nn.LSTM": _SEQUENCE_FIXES.get(cell, _SEQUENCE_FIXES["aten::lstm_cell"])},
            fix_targets=("nn.LSTM",),
        )
    return Verdict(
        title=f"A Python loop indexes tensors element by element: {iterations:.0f} iterations per step, {ms(loop_us)} ({where})",
        share=(low + high) / 2.0,
        share_range=(low, high),
        evidence=evidence,
        recommendation="Replace the loop with one vectorised operation: index with a tensor of indices or a mask "
        "(t[idx] = values, torch.index_select, torch.gather, torch.where) instead of t[i] in a for loop. Where "
        "each iteration runs a model or function on t[i], run it once on the whole tensor (fold the looped "
        "dimension into the batch, e.g. model(t.flatten(0, 1))).",
        fix_targets=("indexing loop",),
    )


MIN_RECURRENT_STEPS = 10  # cell calls per step that make a loop over time steps (the matcher's loop threshold)
_SEQUENCE_MODULES = {"aten::lstm_cell": "nn.LSTM", "aten::gru_cell": "nn.GRU", "aten::rnn_tanh_cell": "nn.RNN", "aten::rnn_relu_cell": "nn.RNN"}
_SEQUENCE_FIXES = {
    "aten::lstm_cell": "output, (h, c) = nn.LSTM(input_size, hidden_size)(x)  # x: (time, batch, features)",
    "aten::gru_cell": "output, h = nn.GRU(input_size, hidden_size)(x)  # x: (time, batch, features)",
    "aten::rnn_tanh_cell": "output, h = nn.RNN(input_size, hidden_size)(x)  # x: (time, batch, features)",
    "aten::rnn_relu_cell": "output, h = nn.RNN(input_size, hidden_size, nonlinearity='relu')(x)  # x: (time, batch, features)",
}


EXTRA_COPY = Threshold(0, "any tensor filled on the CPU and copied to the device at once (torch.profiler `_pattern_matcher` ExtraCUDACopyPattern)")


@rule(
    "host_overhead.extra_device_copy",
    "host_overhead",
    EXTRA_COPY,
    fixes=(
        Fix(
            kind="code_change",
            target="tensor creation",
            value="torch.zeros(..., device='cuda')",
            summary="create the tensor on the device instead of filling it on the CPU and copying it",
        ),
    ),
)
def host_overhead_extra_device_copy(ctx: Context) -> Optional[Verdict]:
    """Tensors made on the CPU (zeros, ones, randn, ...) and copied to the device right away (costed by
    the copies' host time, which creating them on the device removes)."""
    # A same-dtype copy on a CPU-only run goes to no device: nothing to create there. A GPU run recorded
    # without device activity still names its accelerator in the manifest.
    if not ctx.has_device and ctx.environment().get("accelerator") in (None, "cpu"):
        return None
    patterns = ctx.report.measurements.patterns
    copies = patterns.extra_device_copies_per_step
    if copies <= EXTRA_COPY.value:
        return None
    copy_us = patterns.extra_device_copy_us_per_step
    return Verdict(
        title=f"{copies:.0f} tensor(s) per step are filled on the CPU and then copied to the device ({ms(copy_us)} of copies)",
        share=ctx.share(copy_us),
        evidence={"extra_device_copies_per_step": copies, "extra_device_copy_us_per_step": copy_us},
        recommendation="Create those tensors on the device directly (torch.zeros(..., device='cuda'), "
        "torch.randn(..., device=x.device)) instead of filling them on the CPU and calling .to()/.cuda().",
    )
