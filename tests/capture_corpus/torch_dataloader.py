import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.arange(32, dtype=torch.float32).reshape(16, 2))
total = 0.0
for (batch,) in DataLoader(data, batch_size=4):
    total += float(batch.sum())
print(total)
