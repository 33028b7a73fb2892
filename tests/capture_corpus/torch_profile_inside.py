import torch

import torchscope

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torchscope.profile(out="inner", wait=0, warmup=1, active=2, repeat=1) as prof:
    for _ in range(5):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
print("inner traces", len(prof.trace_files))
