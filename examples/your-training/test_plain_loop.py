"""A plain PyTorch loop, judged in your own pytest by the memclaims_watch fixture."""

import pytest
import torch
from torch import nn


def train(model, optimizer, steps=4, device="cpu"):
    for _ in range(steps):
        inputs, targets = torch.randn(32, 256, device=device), torch.randint(0, 10, (32,), device=device)
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


@pytest.mark.requires(cuda_devices=1)
@pytest.mark.memclaims_budget("24 GiB")
def test_training_memory_on_cuda(memclaims_watch):
    """The same on a GPU: the caching allocator's peaks, the budget bounding the peak reserved bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with memclaims_watch(model, optimizer):
        train(model, optimizer, device="cuda")
