"""Step detection rules without torch (issue 13): the pure StepDetector fed with boundary events, and the
`torchscope.step()` marker's registry."""

from __future__ import annotations

from typing import Any

from torchscope.capture import steps
from torchscope.capture.steps import StepDetector

MODEL, CRITERION, OTHER = 101, 202, 303


class _Counter:
    def __init__(self) -> None:
        self.steps = 0

    def __call__(self) -> None:
        self.steps += 1


def _drive(script: list[Any], optimizer_created: bool = False) -> tuple[StepDetector, _Counter]:
    counter = _Counter()
    detector = StepDetector(counter, optimizer_created=lambda: optimizer_created)
    for event in script:
        if isinstance(event, tuple):
            detector.on_boundary(*event)
        elif isinstance(event, str):
            detector.on_boundary(event)
        else:
            detector.on_optimizer_step(event)
    return detector, counter


def test_manual_sgd_steps_at_the_forward_after_each_backward() -> None:
    iteration = [("forward", MODEL), ("forward", CRITERION), "backward"]
    detector, counter = _drive(iteration * 5)
    assert detector.source == "backward" and counter.steps == 4


def test_gradient_checkpoint_style_forward_inside_an_iteration_does_not_double_steps() -> None:
    # Two top-level forwards (an encoder, then a decoder) before the single backward.
    iteration = [("forward", MODEL), ("forward", OTHER), ("forward", CRITERION), "backward"]
    detector, counter = _drive(iteration * 4)
    assert detector.source == "backward" and counter.steps == 3


def test_evaluation_loop_steps_at_each_call_of_the_first_module() -> None:
    iteration = [("forward", MODEL), ("forward", OTHER)]
    detector, counter = _drive(iteration * 6)
    assert detector.source == "module" and counter.steps == 5


def test_an_encoder_called_once_per_iteration_anchors_the_steps() -> None:
    # Encoder once, decoder several times per iteration (autoregressive decoding): one step per iteration.
    detector, counter = _drive([("forward", MODEL)] + [("forward", OTHER)] * 3 + [("forward", MODEL)] + [("forward", OTHER)] * 3)
    assert detector.source == "module" and counter.steps == 1


def test_a_single_fetch_then_a_loop_uses_the_backward_rule() -> None:
    detector, counter = _drive(["data"] + [("forward", MODEL), "backward"] * 4)
    assert detector.source == "backward" and counter.steps == 3


def test_dataloader_keeps_priority_over_backward() -> None:
    detector, counter = _drive(["data", ("forward", MODEL), "backward"] * 4)
    assert detector.source == "dataloader" and counter.steps == 3


def test_an_optimizer_takes_over_from_the_backward_rule() -> None:
    opt = object()
    detector, counter = _drive([("forward", MODEL), "backward"] * 2 + [opt] + [("forward", MODEL), "backward", opt] * 3)
    assert detector.source == "optimizer"
    assert counter.steps == 1 + 3  # one from the backward rule, then one per optimizer step (the last pending)


def test_an_evaluation_after_the_optimizer_step_stays_in_that_step() -> None:
    """The deferred optimizer boundary waits for an event with autograd on: the validation loop's fetches and
    forwards under no_grad after step 2 stay in step 2, and the next training fetch starts step 3."""
    opt = object()
    train = ["data", ("forward", MODEL), "backward", opt]
    evaluation = [("data", 0, False), ("forward", MODEL, False)] * 5
    counter = _Counter()
    detector = StepDetector(counter)
    marks_at: list[int] = []
    for i, event in enumerate(train * 2 + evaluation + train * 2):
        before = counter.steps
        if event is opt:
            detector.on_optimizer_step(opt)
        else:
            detector.on_boundary(*event) if isinstance(event, tuple) else detector.on_boundary(event)
        if counter.steps > before:
            marks_at.append(i)
    # boundaries at the second and third training fetches (events 4 and 18), none inside the evaluation
    assert detector.source == "optimizer" and marks_at == [4, 18, 22]
    # Without an optimizer (an inference script), no-grad fetches still mark the DataLoader's steps.
    _, inference = _drive([("data", 0, False), ("forward", MODEL, False)] * 4)
    assert inference.steps == 3


def test_fallbacks_wait_for_an_optimizer_that_exists_to_step() -> None:
    # Gradient accumulation: 4 fetches and backwards per optimizer step. The DataLoader rule would mark
    # each micro-batch before the first optimizer step; with an optimizer built, those boundaries are held.
    opt = object()
    micro = ["data", ("forward", MODEL), "backward"]
    script = (micro * 4 + [opt]) * 3 + ["data"]
    detector, counter = _drive(script, optimizer_created=True)
    assert detector.source == "optimizer" and detector.held == 3  # fetches 2-4 of the first cycle
    assert counter.steps == 3  # one per optimizer step, none per micro-batch
    # Without an optimizer the same loop steps at every fetch after the first until one exists.
    _, unheld = _drive(micro * 4)
    assert unheld.steps == 3


def test_an_optimizer_that_never_steps_delays_the_fallback_by_at_most_max_held() -> None:
    detector, counter = _drive(["data"] * (steps.MAX_HELD + 6), optimizer_created=True)
    assert detector.held == steps.MAX_HELD and counter.steps == 5 and detector.source == "dataloader"
    # Model calls alone (no fetch, no backward) wait for it as long as it takes: a rollout may be that long.
    detector, counter = _drive([("forward", MODEL, False)] * (steps.MAX_HELD + 6), optimizer_created=True)
    assert detector.held == steps.MAX_HELD + 5 and counter.steps == 0 and detector.source == "module"


def test_a_rollout_of_model_calls_before_the_first_update_is_held_however_long() -> None:
    # Reinforcement learning: 100 policy calls without gradients, then the update's forward, backward and
    # optimizer step. Past MAX_HELD the rollout's calls became steps, and the recorded window held single
    # policy calls before the optimizer had stepped once.
    opt = object()
    iteration = [("forward", MODEL, False)] * 100 + [("forward", MODEL), "backward", opt]
    detector, counter = _drive(iteration * 4, optimizer_created=True)
    assert detector.source == "optimizer" and detector.held == 100 and counter.steps == 3
    # Without an optimizer (a rollout-only script) each call is a step, as before.
    _, rollout = _drive([("forward", MODEL, False)] * 100)
    assert rollout.steps == 99


def test_the_marker_replaces_detection() -> None:
    opt = object()
    counter = _Counter()
    detector = StepDetector(counter)
    for _ in range(4):
        for _ in range(3):  # three optimizer steps per marked step
            detector.on_boundary("forward", MODEL)
            detector.on_boundary("backward")
            detector.on_optimizer_step(opt)
        detector.on_marker()
    # The first iteration's two optimizer boundaries fired before the first marker; then only markers.
    assert detector.source == "manual" and counter.steps == 2 + 4


def test_mark_step_reaches_the_latest_recording_capture_only() -> None:
    first, second = _Counter(), _Counter()
    steps.mark_step()  # nothing records: a no-op
    steps.register_marker(first)
    steps.register_marker(second)
    try:
        steps.mark_step()
        assert (first.steps, second.steps) == (0, 1)
        steps.unregister_marker(second)
        steps.mark_step()
        assert (first.steps, second.steps) == (1, 1)
    finally:
        steps.unregister_marker(first)
        steps.unregister_marker(second)
    steps.mark_step()
    assert (first.steps, second.steps) == (1, 1)
