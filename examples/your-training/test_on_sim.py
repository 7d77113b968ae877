"""A plain PyTorch loop's CUDA peaks predicted on the sim, at full size, without a GPU: the model is built inside the
watch (on the sim's fake tensors), and the loop runs as it is."""

import torch
from torch import nn


def build():
    return nn.Sequential(nn.Linear(8192, 16384), nn.ReLU(), nn.Linear(16384, 1000))  # 151 M parameters


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, optimizer, steps=3):
    for _ in range(steps):
        inputs, targets = torch.randn(256, 8192), torch.randint(0, 1000, (256,))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_training_memory_on_the_sim(memclaims_watch):
    with memclaims_watch(build, make_optimizer, device="sim") as watched:  # judged against its baseline
        train(watched.model, watched.optimizer)
    peak = watched.record.peak_reserved_total_bytes
    assert peak > 2 * 2**30  # 2.95 GiB predicted for the card; nothing that size was allocated here
