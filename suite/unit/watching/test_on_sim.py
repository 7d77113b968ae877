"""The watch on the sim (issue #50 item 4): the user's own loop on fake tensors predicts what memclaims' own sim replay
of the same model predicts, and a value the sim cannot know is one line naming the op and the file:line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import memclaims
from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import resolve
from memclaims.sim.replays import simulate
from memclaims.workloads import user

STEPS, BATCH, WIDTH = 2, 64, 1024


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.body(inputs)


def _build(scale: object = None) -> nn.Module:
    return nn.Sequential(Block(), nn.Linear(4 * WIDTH, 10))


def _data(scale: object = None) -> TensorDataset:
    return TensorDataset(torch.randn(4 * BATCH, WIDTH), torch.randint(0, 10, (4 * BATCH,)))


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def _plain_loop(watched: memclaims.watching.Watch, steps: int = STEPS) -> None:
    model, optimizer = watched.model, watched.optimizer
    for _ in range(steps):
        inputs, targets = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))  # fake: made inside the watch
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()  # the engine's loop order: zero_grad after the forward
        loss.backward()
        optimizer.step()


def test_a_plain_loop_on_the_sim_predicts_what_memclaims_sim_replay_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every training phase's predicted peak equal to the byte: the same fake-tensor device, allocator model and loop
    order (the sim is deterministic: its spread is 0 B); only the load differs (the replay builds on the host and moves
    the parameters, the watch builds on the device, as init_module does), so it is not compared."""
    monkeypatch.setattr(user, "_registered", dict(user._registered))  # the workload leaves with the test
    user.register(user.define("watch-sim-mlp", build_model=_build, train_data=_data, test_data=_data,
                              block_class=Block, num_classes=10, article_batch_size=BATCH, memory_steps=STEPS))
    own = simulate(resolve("watch-sim-mlp", "article", ()), profile="current")
    with memclaims.watch(_build, _adamw, device="sim", profile="current") as watched:
        _plain_loop(watched)
    mine = watched.record
    assert (mine.device, mine.probe) == ("sim", own.probe)
    phases = ("forward", "zero_grad", "backward", "optimizer_step", "train")
    for key in ("allocated_bytes", "reserved_bytes"):
        assert {p: mine.phases[p][key] for p in phases} == {p: own.phases[p][key] for p in phases}, key
    assert (mine.param_bytes, mine.grad_bytes, mine.optimizer_state_bytes) == (
        own.param_bytes, own.grad_bytes, own.optimizer_state_bytes)
    assert any("foreach=True" in note for note in mine.notes)  # the GPU's default step, said


def test_a_value_read_that_steers_the_loop_is_one_line_naming_the_file_and_line() -> None:
    with pytest.raises(UsageError) as raised:
        with memclaims.watch(_build, _adamw, device="sim") as watched:
            for _ in range(STEPS):
                loss = nn.functional.cross_entropy(watched.model(torch.randn(BATCH, WIDTH)), torch.zeros(BATCH).long())
                if loss.item() > 100.0:  # steers the loop: no stand-in can know it
                    break
                loss.backward()
                watched.optimizer.step()
    message = str(raised.value)
    assert "\n" not in message and "_local_scalar_dense" in message, message
    assert f"{__file__.rsplit('/', 1)[-1]}:" in message and "test_on_sim.py:" in message, message
    assert raised.value.__suppress_context__  # the fake tensor's traceback is not chained on


def test_the_sim_needs_the_model_built_inside_the_watch() -> None:
    with pytest.raises(UsageError, match="give the function that builds the model"):
        memclaims.watch(_build(), device="sim")


def test_a_batch_made_before_the_watch_is_one_line_not_a_silent_undercount() -> None:
    """A real batch would join the fake tensors with no device copy counted: refused, naming the op and the line."""
    batch = torch.randn(BATCH, WIDTH)  # real: made before the watch
    with pytest.raises(UsageError) as raised:
        with memclaims.watch(_build, _adamw, device="sim") as watched:
            watched.model(batch).sum().backward()
    message = str(raised.value)
    assert "\n" not in message and "aten.addmm.default a tensor made before the watch" in message, message
    assert "test_on_sim.py:" in message, message
