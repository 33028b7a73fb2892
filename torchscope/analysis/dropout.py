"""Dropout on the CPU: what its random masks cost a step.

In training, `F.dropout` runs as `aten::dropout` (or `feature_dropout`, `alpha_dropout`), which on a CPU draws
its mask with `aten::bernoulli_` and multiplies by it. PyTorch's CPU generator draws the mask on one thread,
so that part takes the same time with 1 intra-op thread or 32 (a 16x120x1024 float mask: 9.4 ms either
way, where a multiply of the same tensor took 2.6 ms on 1 thread and 0.7 ms on 2), and torch.compile keeps
it (an encoder LM: dropout cost 52 ms of a 220 ms eager step, 67 ms compiled). Measured in eager mode only:
compiled, the mask is drawn inside generated code (the trace shows only `aten::randint` for its seeds). On a
GPU the mask is one fused kernel: not measured there.
"""

from __future__ import annotations

import numpy as np

from torchscope.analysis.markers import named_ops_in_steps, named_rows
from torchscope.analysis.nesting import has_ancestor_in
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.report.measurements import Dropout
from torchscope.trace.kinds import Kind

# The in-place forms too: nn.Dropout(inplace=True) records `aten::dropout_` (torchvision's classifiers use it).
_DROPOUT_OPS = frozenset(
    f"aten::{name}{suffix}" for name in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout") for suffix in ("", "_")
) | {"aten::native_dropout"}
_RNG_OPS = frozenset({"aten::bernoulli_", "aten::bernoulli", "aten::uniform_", "aten::rand_like", "aten::rand"})


def is_dropout(name: str) -> bool:
    return name in _DROPOUT_OPS


def is_rng(name: str) -> bool:
    return name in _RNG_OPS


def dropout(span: SpanInput) -> Dropout | None:
    """The outermost dropout operators inside the steps of a CPU trace, and the random draws inside them,
    per step (None: a GPU trace, or no dropout in training)."""
    events = span.events
    if span.has_device or len(span.steps) == 0:
        return None
    found = named_ops_in_steps(events, event_steps(events, span.steps), is_dropout)
    if found.size == 0:
        return None
    mask = np.zeros(len(events), dtype=bool)
    mask[found] = True
    # Outermost only (aten::dropout holds native_dropout where a backend dispatches to it).
    outermost = found[~has_ancestor_in(span.tree, mask, found)]
    rng = named_rows(events, is_rng, (Kind.CPU_OP,))
    rng = rng[has_ancestor_in(span.tree, mask, rng)]  # the draws inside a dropout op
    drawing = np.zeros(len(events), dtype=bool)
    drawing[rng] = True
    rng = rng[~has_ancestor_in(span.tree, drawing, rng)]  # outermost (aten::bernoulli holds aten::bernoulli_)
    n = len(span.steps)
    return Dropout(
        calls_per_step=outermost.size / n,
        dropout_us_per_step=float(events.dur_us[outermost].sum()) / n,
        mask_us_per_step=float(events.dur_us[rng].sum()) / n,
    )
