"""The model built inside memclaims.watch: python watch_a_build.py prints the load phase's peak, the build's own."""

import torch
from torch import nn

import memclaims


def build() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))  # built in fp32,
    return model.to(torch.bfloat16)  # then converted: both copies are held for a while


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


with memclaims.watch(build, make_optimizer) as watched:  # the watch builds the model in its load phase
    model, optimizer = watched.model, watched.optimizer
    for _ in range(4):
        inputs, targets = torch.randn(32, 256, dtype=torch.bfloat16), torch.randint(0, 10, (32,))
        loss = nn.functional.cross_entropy(model(inputs).float(), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

record = watched.record
print(f"load peak: {record.load_peak_bytes / 2**20:.2f} MiB")
print(f"parameters: {record.param_bytes / 2**20:.2f} MiB")
