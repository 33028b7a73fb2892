"""The per-module view on a real CPU capture (issue 13): torchscope.profile() with stacks, then the
Report's `modules` rows and the terminal's table."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


class Net(torch.nn.Module):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        return self.head(self.body(x))


def test_time_per_module_from_a_real_capture(tmp_path: Path) -> None:
    import torchscope
    from torchscope.render.terminal import render_terminal

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 32), torch.randint(0, 4, (256,))
    with torchscope.profile(out=tmp_path / "run", wait=0, warmup=1, active=3, profile_memory=False) as prof:
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    report = torchscope.analyze(tmp_path / "run", use_cache=False)
    rows = {row.path: row for row in report.modules}
    assert set(rows) == {
        "Net_0", "Net_0/Sequential_0", "Net_0/Sequential_0/Linear_0", "Net_0/Sequential_0/ReLU_0",
        "Net_0/Sequential_0/Linear_1", "Net_0/Linear_2",
    }
    assert all(row.calls_per_step == 1.0 and row.calls == 3 for row in rows.values())
    net, body = rows["Net_0"], rows["Net_0/Sequential_0"]
    children = [rows[p] for p in rows if p.startswith("Net_0/Sequential_0/")]
    assert body.host_us_per_step >= sum(c.host_us_per_step for c in children) * 0.999
    assert body.host_self_us_per_step == pytest.approx(body.host_us_per_step - sum(c.host_us_per_step for c in children), rel=1e-6)
    assert net.host_us_per_step >= body.host_us_per_step + rows["Net_0/Linear_2"].host_us_per_step
    # The model's forward is within the forward phase's time.
    assert net.host_us_per_step <= report.breakdown["forward"].us * 1.01
    text = render_terminal(report, width=100)
    assert "Net_0/Sequential_0/Linear_0" in text
    # Call sites: the model's linear layers are called from Net.forward, in this file (the Python tracer
    # names a frame by its function's first line).
    sites = {(r.operator, r.site) for r in report.call_sites}
    line = Net.forward.__code__.co_firstlineno
    assert ("aten::addmm", f"forward (test_modules_capture.py:{line})") in sites
    assert "Call sites of the top operators" in text
