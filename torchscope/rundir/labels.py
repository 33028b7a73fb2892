"""Names of the ranges that mark steps and training phases in a trace.

``torch.profiler`` records each ``prof.step()`` window as ``ProfilerStep#<N>``; the capture's phase hooks
(:mod:`torchscope.capture.phases`) record ``torchscope:forward``, ``torchscope:backward`` and
``torchscope:optimizer`` as ``record_function`` ranges. The analyses find steps and phases by these names,
so they are declared here, once, for both sides.
"""

from __future__ import annotations

from typing import Literal

STEP_PREFIX = "ProfilerStep#"
LABEL_PREFIX = "torchscope:"  # every range torchscope itself records starts with this

Phase = Literal["forward", "backward", "optimizer"]

FORWARD = LABEL_PREFIX + "forward"
BACKWARD = LABEL_PREFIX + "backward"
OPTIMIZER = LABEL_PREFIX + "optimizer"
PHASE_LABELS: dict[Phase, str] = {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER}
# The closure an ``optimizer.step(closure)`` runs (LBFGS, Lightning): its forward and backward are not the
# optimizer's. The optimizer label is suspended while it runs; this range marks the closure itself.
CLOSURE = LABEL_PREFIX + "closure"
