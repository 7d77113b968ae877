"""An Accelerate loop: the watch around what accelerator.prepare returned."""

import torch
from accelerate import Accelerator
from torch import nn


def test_accelerate_training_memory(memclaims_watch):
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(128, 256), torch.randint(0, 10, (128,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with memclaims_watch(model, optimizer):
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
