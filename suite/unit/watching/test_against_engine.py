"""The watch against memclaims' own engine: the same MLP, batch, optimizer and loop order, once through
``run_recipe`` (Fabric on the CPU) as a user workload and once as a user's plain loop under ``memclaims.watch``:
every step phase's peak equal to the byte (exact accounting; the spread on the cpu tier is 0 B)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import memclaims
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import run_recipe
from memclaims.workloads import user

STEPS, BATCH = 4, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.body(inputs)


def _build(scale: object = None) -> nn.Module:
    return nn.Sequential(Block(), nn.Linear(128, 10))


def _data(scale: object = None) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(4 * BATCH, 64, generator=generator),
                         torch.randint(0, 10, (4 * BATCH,), generator=generator))


def test_a_watched_plain_loop_peaks_where_memclaims_engine_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user, "_registered", dict(user._registered))  # the workload leaves with the test
    user.register(user.define("watch-mlp", build_model=_build, train_data=_data, test_data=_data, block_class=Block,
                              num_classes=10, smoke_batch_size=BATCH, memory_steps=STEPS))
    recipe = resolve("watch-mlp", "smoke", ())
    assert recipe.optimizer == "adam"  # the engine's AdamW (memclaims.measure.optimizers)
    own = run_recipe(recipe, RunOptions(device="cpu", evaluate=False))[0]

    torch.manual_seed(0)
    model = _build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(_data(), batch_size=BATCH, shuffle=True, drop_last=True)
    with memclaims.watch(model, optimizer) as watched:
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()  # the engine's loop order (Lightning's): zero_grad after the forward
            loss.backward()
            optimizer.step()
    mine = watched.record
    phases = ("forward", "zero_grad", "backward", "optimizer_step", "train")
    assert {p: mine.phases[p]["allocated_bytes"] for p in phases} == {p: own.phases[p]["allocated_bytes"] for p in phases}
    assert mine.step_peaks == own.step_peaks
    assert (mine.param_bytes, mine.grad_bytes, mine.optimizer_state_bytes) == (
        own.param_bytes, own.grad_bytes, own.optimizer_state_bytes)
