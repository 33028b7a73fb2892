"""Real captures (`torchscope run`) of a small causal self-attention model trained on the CPU, written out op
by op, with F.scaled_dot_product_attention, and through nn.MultiheadAttention with and without its default
need_weights=True: compute.unfused_attention names the written-out forms and stays quiet on the fused ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = """
import math, sys
import torch, torch.nn as nn, torch.nn.functional as F
form = sys.argv[1]
B, T, C, H = 4, 256, 64, 4
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mha = nn.MultiheadAttention(C, H, batch_first=True)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
    def forward(self, x):
        if form.startswith("mha"):
            return self.mha(x, x, x, need_weights=form == "mha-default")[0]
        b, t, c = x.shape
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in self.qkv(x).split(C, dim=2))
        if form == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = F.softmax(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            if form == "manual-dropout":
                att = F.dropout(att, 0.1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
model = nn.Sequential(nn.Embedding(100, C), Attention(), nn.LayerNorm(C), Attention(), nn.Linear(C, 100))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    idx = torch.randint(0, 100, (B, T + 1))
    loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, 100), idx[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("form", ["manual", "manual-dropout", "sdpa", "mha-default", "mha-no-weights"])
def test_real_attention_capture(tmp_path: Path, form: str) -> None:
    run = capture(tmp_path, SCRIPT, "train.py", form, options=("--stop-after-active",))
    rep = torchscope.analyze(run, jobs=1, use_cache=False)
    found = {f.id: f for f in rep.findings}
    section = rep.measurements.attention
    if form in ("sdpa", "mha-no-weights"):
        assert section.calls_per_step == 0 and section.fused_calls_per_step == 2
        assert "compute.unfused_attention" not in found
        return
    assert section.calls_per_step == 2 and section.score_shapes == ["16x256x256"]
    assert section.need_weights_calls_per_step == (2 if form == "mha-default" else 0)
    assert section.dropout_calls_per_step == (2 if form == "manual-dropout" else 0)
    if form == "mha-default":  # its softmax and weights average are a small part here: no finding needed
        if "compute.unfused_attention" in found:
            assert [fix.target for fix in found["compute.unfused_attention"].fixes] == ["torch.nn.MultiheadAttention"]
        return
    f = found["compute.unfused_attention"]
    assert f.time_share is not None and f.time_share > 0.05
    assert [fix.target for fix in f.fixes] == ["torch.nn.functional.scaled_dot_product_attention"]
    low, high = f.time_share_low, f.time_share_high
    assert low is not None and high is not None
    assert (low == 0.0) == (form == "manual-dropout") and high > 0.05
