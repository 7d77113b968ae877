"""A plain PyTorch loop, judged in your own pytest by the memclaims_watch fixture."""

import torch
from torch import nn


def train(model, optimizer, steps=4):
    for _ in range(steps):
        inputs, targets = torch.randn(32, 256), torch.randint(0, 10, (32,))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_training_memory(memclaims_watch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with memclaims_watch(model, optimizer):  # judged against its baseline when the block ends
        train(model, optimizer)
