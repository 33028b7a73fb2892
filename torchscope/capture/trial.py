"""One trial of `torchscope tune`: run the user's script under the profiler with some fixes applied.

    python -m torchscope.capture.trial --fixes FIXES.json --out DIR --record RECORD.json --active N
        (script.py | -m module) [args]

Runs in its own process (a fix must not leak into the next trial) and stops once the active steps are
captured. RECORD.json gets what the run itself showed: where each fix reached the code (`sites`, from
capture/interventions.py) and the loss of each backward pass (`losses`: the scalar `Tensor.backward` was
called on), for tune's loss-sanity check; under torchrun, rank 0's. Exit status: the script's (0 also when the capture stopped it).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import msgspec

from torchscope.capture import interventions
from torchscope.capture.runner import Target, run_target
from torchscope.files import write_atomic
from torchscope.report.model import Fix
from torchscope.rundir.config import CaptureConfig

MAX_LOSSES = 10_000  # a long script must not grow the record without bound


class TrialRecord(msgspec.Struct, kw_only=True):
    """What a trial saw besides its trace."""

    sites: dict[str, list[str]] = {}
    losses: list[Optional[float]] = []  # None: a non-finite loss (NaN or inf)
    compile_s: Optional[float] = None  # torch.compile trials: interventions.compile_seconds (None: not compiled)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchscope.capture.trial")
    parser.add_argument("--fixes", type=Path, required=True, help="JSON list of fixes to apply")
    parser.add_argument("--out", required=True)
    parser.add_argument("--record", type=Path, required=True, help="where to write the TrialRecord (JSON)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=5)
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER)
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    fixes = msgspec.json.decode(args.fixes.read_bytes(), type=list[Fix])
    target = Target("module", args.module[0], tuple(args.module[1:])) if args.module else Target("script", args.target[0], tuple(args.target[1:]))
    # Timing, not culprits: no stacks, shapes or memory events (they slow Python-heavy steps unevenly).
    config = CaptureConfig(out=args.out, wait=1, warmup=args.warmup, active=args.active, record_shapes=False,
                           profile_memory=False, with_stack=False, with_flops=False, stop_after_active=True)
    losses: list[Any] = []
    backward_s: list[float] = []
    try:
        with applied_with_losses(fixes, losses, backward_s):
            outcome = run_target(target, config)
    finally:
        if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0's record stands for the launch
            compile_s = interventions.compile_seconds(interventions.forward_s, backward_s) \
                if any(interventions.is_compile(f) for f in fixes) else None
            record = TrialRecord(sites={k: sorted(v) for k, v in interventions.sites.items()}, losses=_floats(losses),
                                 compile_s=compile_s)
            write_atomic(args.record, msgspec.json.encode(record))
    if outcome.exception is not None:
        print(f"trial failed: {type(outcome.exception).__name__}: {outcome.exception}", file=sys.stderr)
    return outcome.exit_code


@contextmanager
def applied_with_losses(fixes: Sequence[Fix], losses: list[Any], backward_s: Optional[list[float]] = None) -> Iterator[None]:
    """The fixes applied, and every scalar `Tensor.backward` kept (detached, no device sync) in `losses`;
    the wall time of each such backward call (host time, no device sync) in `backward_s`."""
    import torch

    original = torch.Tensor.backward

    @functools.wraps(original)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.numel() != 1 or len(losses) >= MAX_LOSSES:
            return original(self, *args, **kwargs)
        losses.append(self.detach().clone())
        began = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            if backward_s is not None:
                backward_s.append(time.perf_counter() - began)

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    try:
        with interventions.applied(fixes):
            yield
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]


def _floats(values: list[Any]) -> list[Optional[float]]:
    numbers = [float(value.float().cpu()) for value in values]
    return [n if math.isfinite(n) else None for n in numbers]


if __name__ == "__main__":
    sys.exit(main())
