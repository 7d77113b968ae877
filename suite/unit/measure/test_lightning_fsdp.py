"""The CUDA side of a sharded run, without a GPU: Lightning's Fabric is replaced by a recorder.

What is checked is memclaims' wiring of the article's scripts 08, 09 and 11 (how Fabric is built,
what ``init_module`` and ``setup`` receive, what the Record counts), not FSDP itself: that needs
GPUs and is the ``dist`` + ``gpu`` tier.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from torch import nn

from fixtures.fake_fabric import RecordingFabric
from fixtures.fake_fabric import run_recipe as _run
from memclaims.measure import lightning_fsdp, runner
from memclaims.recipes.recipe import resolve

FSDP_AC = ("fsdp", "activation-checkpointing")


@pytest.mark.cpu
def test_fsdp_with_checkpointing_is_the_08_script(fake_cuda) -> None:
    record = _run(FSDP_AC)
    (fabric,) = fake_cuda.instances
    strategy = fabric.kwargs["strategy"]
    assert (fabric.kwargs["accelerator"], fabric.kwargs["devices"], fabric.kwargs["num_nodes"]) == ("cuda", 4, 1)
    assert strategy._activation_checkpointing_kwargs and not strategy.cpu_offload.offload_params
    assert fabric.calls == [("launch", None), ("setup", True)]
    assert record.device == "cuda" and record.device_name == "Fake GPU"


@pytest.mark.cpu
def test_offload_keeps_the_model_on_the_host_as_09(fake_cuda) -> None:
    _run(FSDP_AC + ("cpu-offload",))
    (fabric,) = fake_cuda.instances
    assert fabric.kwargs["strategy"].cpu_offload.offload_params
    assert ("setup", False) in fabric.calls  # setup(..., move_to_device=False)


@pytest.mark.cpu
def test_delayed_init_builds_inside_init_module_as_11(fake_cuda) -> None:
    _run(FSDP_AC + ("cpu-offload", "delayed-init"))
    (fabric,) = fake_cuda.instances
    assert fabric.calls[:2] == [("launch", None), ("init_module", False)]  # empty_init=False, as logged


@pytest.mark.cpu
def test_param_count_is_the_whole_model_not_the_shard(fake_cuda, monkeypatch) -> None:
    """FSDP's parameters are flat shards after setup; the Record counts the model as built."""
    whole = resolve("vit", "smoke", []).workload.build_model(resolve("vit", "smoke", []).scale)[0]
    expected = sum(p.numel() for p in whole.parameters())

    class ShardView(nn.Module):
        """What FSDP hands back: the same forward, but only this rank's share of the parameters."""

        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner(*args)

        def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
            return iter(list(self.inner.parameters())[::4])

    def shard_on_setup(self: RecordingFabric, model: nn.Module, optimizer: Any, move_to_device: bool = True):
        return ShardView(model), optimizer

    monkeypatch.setattr(RecordingFabric, "setup", shard_on_setup)
    record = _run(("fsdp",))
    assert record.param_count == expected
    assert record.param_tensor_count == len(list(whole.parameters()))
    assert record.param_bytes < 4 * expected  # the probe still measures the shard it was given


@pytest.mark.cpu
@pytest.mark.parametrize(("environment", "devices", "nodes"), [
    ({}, 4, 1),
    ({"LOCAL_WORLD_SIZE": "4"}, 4, 2),  # torchrun --nnodes 2 --nproc-per-node 4: 8 ranks
])
def test_fabric_counts_devices_per_node(fake_cuda, monkeypatch, environment, devices, nodes) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    world = 8 if nodes == 2 else 4
    lightning_fsdp.sharded_fabric(resolve("vit", "smoke", ("fsdp",)),
                               runner.RunOptions(device="cuda", devices=world))
    (fabric,) = fake_cuda.instances
    assert (fabric.kwargs["devices"], fabric.kwargs["num_nodes"]) == (devices, nodes)
    assert fabric.calls == [("launch", None)]
