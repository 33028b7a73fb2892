import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 4:
        raise RuntimeError(f"diverged at step {step}")
