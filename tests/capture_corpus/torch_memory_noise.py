import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = [torch.randn(256) for _ in range(4)]  # allocated before any profiling: freed while it runs
for step in range(8):
    if step == 3:
        del kept
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
print("done")
