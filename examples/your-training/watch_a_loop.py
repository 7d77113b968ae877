"""A plain PyTorch loop under memclaims.watch: python watch_a_loop.py prints each phase's peak."""

import torch
from torch import nn

import memclaims

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

with memclaims.watch(model, optimizer) as watched:  # the one added line: the loop is unchanged
    for _ in range(4):
        inputs, targets = torch.randn(32, 256), torch.randint(0, 10, (32,))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

record = watched.record  # the Record memclaims' own runs produce
for phase in ("forward", "backward", "optimizer_step", "zero_grad"):
    print(f"{phase:>14}: {record.phases[phase]['allocated_bytes'] / 2**20:.2f} MiB peak")
print(f"optimizer state: {record.optimizer_state_bytes / 2**20:.2f} MiB")
