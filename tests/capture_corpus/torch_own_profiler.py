import os

import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
with torch.profiler.profile(schedule=schedule, on_trace_ready=torch.profiler.tensorboard_trace_handler("tb")) as prof:
    for _ in range(6):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
print("traces", len(os.listdir("tb")))
