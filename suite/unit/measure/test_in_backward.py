"""activation-offload and optimizer-in-backward (issue #27) below the case: the per-parameter step in
backward trains as the ordinary loop does, and the CUDA path (pinned save_on_cpu, the hooks under
Fabric's setup) is wired as a GPU run would be, on faked CUDA."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fixtures.fake_fabric import run_recipe as _run
from memclaims.measure import optimizers
from memclaims.recipes.recipe import resolve
from memclaims.techniques.impl.per_parameter_optimizers import OptimizerInBackward

pytestmark = pytest.mark.cpu

# The optimizers a recipe can fuse into backward (the 8-bit ones conflict: memclaims.techniques.technique_registry).
FUSABLE = ("adam", "sgd", "adamw", "adafactor")
STEPS = 3  # past the first step: Adam's bias correction and SGD's cosine schedule both move


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


def _train(model: nn.Module, name: str, fused: bool) -> OptimizerInBackward | None:
    optimizer, scheduler = optimizers.build(name, model, 0.01, total_steps=STEPS)
    in_backward = OptimizerInBackward(optimizer, lambda single: single.step(), "optimizer-in-backward") if fused else None
    data = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        inputs, targets = torch.randn(5, 8, generator=data), torch.randint(0, 4, (5,), generator=data)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        if fused:
            assert all(p.grad is None for p in model.parameters()), "a gradient outlived its step"
        optimizer.step()  # the loop's own step: nothing left to apply under the fused one
        if scheduler is not None:
            scheduler.step()
    return in_backward


@pytest.mark.parametrize("name", FUSABLE)
def test_the_step_in_backward_trains_as_the_ordinary_loop(name: str) -> None:
    ordinary, fused = _model(), _model()
    _train(ordinary, name, fused=False)
    in_backward = _train(fused, name, fused=True)
    assert in_backward is not None
    for (key, expected), got in zip(ordinary.state_dict().items(), fused.state_dict().values()):
        torch.testing.assert_close(got, expected, msg=lambda text, key=key: f"{name}: {key}: {text}")
    params = list(fused.parameters())
    assert in_backward.steps == len(params) * STEPS
    full = sum(p.nbytes for p in params)
    assert 0 < in_backward.grad_peak_bytes <= max(p.nbytes for p in params) < full


def test_the_states_are_read_where_the_recipe_optimizer_keeps_them() -> None:
    """State bytes, the probes and the sim's tags read the recipe's optimizer: the copies' states live there."""
    model = _model()
    optimizer, _ = optimizers.build("adam", model, 0.01, total_steps=1)
    OptimizerInBackward(optimizer, lambda single: single.step(), "optimizer-in-backward")
    model(torch.randn(2, 8)).sum().backward()
    assert len(optimizer.state) == len(list(model.parameters()))
    assert all({"exp_avg", "exp_avg_sq"} <= set(state) for state in optimizer.state.values())


def test_on_cuda_the_offload_is_pinned_and_the_step_runs_in_backward(fake_cuda, monkeypatch) -> None:
    """The gpu tier's path on faked CUDA: save_on_cpu asked to pin (host copies made, here unpinned since
    no driver answers), the hooks registered before Fabric's setup still step every parameter."""
    made: list[bool] = []
    original = torch.autograd.graph.save_on_cpu

    def recording(pin_memory: bool = False, device_type: str = "cuda") -> Any:
        made.append(pin_memory)
        return original(pin_memory=pin_memory, device_type=device_type)

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", recording)
    techniques = ("activation-offload", "optimizer-in-backward")
    record = _run(techniques, devices=1)
    assert made and all(made), made  # pin_memory=True on CUDA, once per forward pass
    assert (record.observed("activation-offload", "offloaded_activation_bytes") or 0) > 0
    assert record.observed("optimizer-in-backward", "backward_optimizer_steps") == \
        record.param_tensor_count * record.memory_steps
    assert record.grad_bytes == 0
    assert resolve("vit", "smoke", techniques).id == record.recipe
