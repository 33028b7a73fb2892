"""What the manifest's `environment` records of the debugging settings that slow training down."""

from __future__ import annotations

import pytest

from torchscope.capture.environment import anomaly_mode_enabled, capture_environment

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("value", "expected"), [("1", True), (" 1 ", True), ("0", False), ("", False), (None, False)])
def test_cuda_launch_blocking(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool) -> None:
    if value is None:
        monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    else:
        monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", value)
    assert capture_environment()["cuda_launch_blocking"] is expected


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_anomaly_mode_now_or_seen_at_a_step() -> None:
    assert capture_environment()["anomaly_mode"] is False
    assert capture_environment(anomaly_seen=True)["anomaly_mode"] is True  # a detect_anomaly() block that ended
    with torch.autograd.detect_anomaly():
        assert anomaly_mode_enabled(torch) and capture_environment()["anomaly_mode"] is True
    assert anomaly_mode_enabled(object()) is False  # never raises
