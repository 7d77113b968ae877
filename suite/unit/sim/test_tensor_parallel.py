"""The sim's tensor-parallel rank (memclaims.sim.replays.tensor_parallel): the split layers'
shards, the all-reduces DTensor allocates around them, and the rank's state against the arithmetic the real ranks
are held to (fixtures.tensor_parallel)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fixtures.tensor_parallel import rank_state_bytes
from memclaims.measure import active
from memclaims.recipes.recipe import resolve
from memclaims.sim import simulate
from memclaims.sim.replays import tensor_parallel as sim_tp
from memclaims.techniques.impl.tensor_parallel_plan import COLWISE, ROWWISE, Layout

pytestmark = pytest.mark.sim

MLP = Layout((("0", COLWISE), ("2", ROWWISE)), source="a test's MLP")


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def test_a_rank_keeps_its_shards_where_torchs_styles_put_them() -> None:
    """ColwiseParallel: 1/N of the weight's and the bias's rows; RowwiseParallel: 1/N of the weight's columns, the
    bias whole."""
    model = _mlp()
    split = sim_tp.split(model, MLP, 4)
    up, down = model[0], model[2]
    assert (tuple(up.weight.shape), tuple(up.bias.shape)) == ((4, 8), (4,))
    assert (tuple(down.weight.shape), tuple(down.bias.shape)) == ((8, 4), (8,))
    assert split.observed(1, fsdp2=False)["local_split_weight_elements"] * 4 == 2 * 16 * 8


class _Clones(TorchDispatchMode):
    """Counts the out-of-place all-reduce outputs (clones) by phase."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.clone.default:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def test_the_collectives_allocate_what_dtensor_allocates() -> None:
    """Forward: the row-wise layer's partial output all-reduced out of place (one clone of the whole output);
    backward: the column-wise layer's input gradient all-reduced out of place (one clone of the whole input)."""
    model = _mlp()
    split = sim_tp.split(model, MLP, 2)
    x = torch.randn(3, 8, requires_grad=True)
    with _Clones() as forward:
        out = model(x)
    assert forward.shapes == [(3, 8)] and tuple(out.shape) == (3, 8)
    with _Clones() as backward:
        out.sum().backward()
    assert backward.shapes == [(3, 8)]
    seen = split.observed(1, fsdp2=False)
    assert (seen["forward_colwise_local_outputs"], seen["forward_rowwise_partial_outputs"]) == (1, 1)
    assert seen["local_split_grad_elements"] == seen["local_split_weight_elements"] == 2 * 8 * 8


def test_heads_are_divided_where_the_layout_names_them() -> None:
    module = nn.Module()
    module.attention = nn.Module()
    module.attention.num_attention_heads = 12
    module.q = nn.Linear(4, 12)
    sim_tp.split(module, Layout((("q", COLWISE),), heads=(("attention", "num_attention_heads"),)), 4)
    assert module.attention.num_attention_heads == 3


@pytest.mark.parametrize(("techniques", "devices", "tp", "dp"), [
    (("tensor-parallel",), 2, 2, 1),
    (("tensor-parallel", "fsdp2"), 4, 2, 2),
])
def test_the_rank_state_is_the_shards_arithmetic(techniques, devices, tp, dp) -> None:
    """hf:llama at smoke scale (fp32): rank 0 holds exactly its tensor-parallel shapes' bytes (with FSDP2: FSDP2's
    dim-0 shard of each), the same arithmetic suite/cases/techniques/test_tensor_parallel.py holds the CPU ranks' real
    DTensors to; and the replay passes the active check."""
    recipe = resolve("hf:llama", "smoke", techniques)
    record = simulate(recipe, devices=devices)
    expected = rank_state_bytes("hf:llama", "smoke", tp, 4, dp=dp)
    assert (record.devices, record.rank) == (devices, 0)
    assert record.param_bytes == expected["param_bytes"], (record.param_bytes, expected)
    assert record.grad_bytes == expected["grad_bytes"], (record.grad_bytes, expected)
    steps = record.optimizer_state_bytes - expected["optimizer_state_bytes"]
    assert steps in (0, 4 * record.param_tensor_count), (record.optimizer_state_bytes, expected)  # Adam's step scalars
    assert record.param_count == 213312  # the whole model's, as the real ranks count it before setup
    assert active.problems(recipe, record) == []


def test_the_ranks_devices_default_to_the_articles_four() -> None:
    record = simulate(resolve("vit", "smoke", ["tensor-parallel"]))
    assert record.devices == 4 and record.by_technique["tensor-parallel"]["tensor_parallel_size"] == 4
