"""Lightning's FSDP configuration read without launching it, and executed with FSDP2 on one CPU rank
(memclaims.techniques.impl.lightning_fsdp_plan)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from memclaims.recipes.recipe import resolve
from memclaims.techniques.impl import lightning_fsdp_plan as plan_module
from memclaims.techniques.impl.lightning_fsdp_plan import UnexecutedSetting

pytestmark = pytest.mark.cpu


def _article_08(**changes: object) -> object:
    """Lightning's FSDPStrategy as the article's 08 script configures it (the CUDA ranks' object), with ``changes``."""
    from lightning.fabric.strategies.fsdp import FSDPStrategy
    from torchvision.models.vision_transformer import EncoderBlock

    return FSDPStrategy(**{"auto_wrap_policy": {EncoderBlock}, "activation_checkpointing_policy": {EncoderBlock},
                           **changes})


# Lightning 2.6.6's FSDPPrecision.mixed_precision_config: every precision in one dtype (PR #21361 made "*-mixed" so).
@pytest.mark.parametrize(("precision", "dtype"), [("32-true", "float32"), ("bf16-mixed", "bfloat16"),
                                                  ("16-mixed", "float16"), ("bf16-true", "bfloat16")])
def test_read_takes_the_mixed_precision_of_the_plugin_fabric_pairs(precision: str, dtype: str) -> None:
    read = plan_module.read(_article_08(), precision)
    assert (read.param_dtype, read.reduce_dtype, read.buffer_dtype) == (dtype, dtype, dtype)
    assert (read.cast_forward_inputs, read.cast_root_forward_inputs) == (False, True)  # MixedPrecision's defaults
    assert read.configured_by.startswith("Lightning 2.") and f"FSDPPrecision({precision!r})" in read.configured_by
    assert (read.sharding_strategy, read.device_mesh, read.offload_params) == ("FULL_SHARD", None, False)
    assert plan_module.describe_policy(read.wrap_policy) == "ModuleWrapPolicy({EncoderBlock})"
    assert [key for key, _ in read.checkpoint_options] == ["auto_wrap_policy"]


def test_read_takes_the_strategys_own_mixed_precision_over_the_plugins() -> None:
    """FSDPStrategy.mixed_precision_config: the strategy's ``mixed_precision`` wins, as setup_module passes it."""
    from torch.distributed.fsdp import MixedPrecision

    read = plan_module.read(_article_08(mixed_precision=MixedPrecision(param_dtype=torch.float16)), "32-true")
    assert (read.param_dtype, read.reduce_dtype, read.buffer_dtype) == ("float16", None, None)


def test_read_takes_offload_sharding_and_the_mesh() -> None:
    read = plan_module.read(_article_08(cpu_offload=True, sharding_strategy="HYBRID_SHARD", device_mesh=(2, 2)), "32-true")
    assert (read.offload_params, read.sharding_strategy, read.device_mesh) == (True, "HYBRID_SHARD", (2, 2))


@pytest.mark.filterwarnings("ignore:.*activation_checkpointing=.* is deprecated")
def test_the_deprecated_checkpointing_argument_is_a_check_fn() -> None:
    """``activation_checkpointing=EncoderBlock`` (the 2023 scripts' form) becomes a ``check_fn``: the same blocks."""
    from torchvision.models.vision_transformer import EncoderBlock

    read = plan_module.read(_article_08(activation_checkpointing_policy=None, activation_checkpointing=EncoderBlock),
                            "32-true")
    model, _ = resolve("vit", "smoke", []).workload.build_model(resolve("vit", "smoke", []).scale)
    blocks = [m for m in model.modules() if isinstance(m, EncoderBlock)]
    assert plan_module.checkpoint_targets(read.checkpoint_options, model) == blocks == \
        plan_module.policy_targets(read.wrap_policy, model)
    assert len(blocks) > 1


@pytest.mark.parametrize(("changes", "named"), [
    ({"limit_all_gathers": True}, "limit_all_gathers=True"),
    ({"use_orig_params": False}, "use_orig_params=False (FSDP2 keeps the original parameters)"),
    ({"forward_prefetch": True}, "forward_prefetch=True"),
])
def test_a_keyword_no_engine_executes_is_named(changes: dict[str, object], named: str) -> None:
    with pytest.raises(UnexecutedSetting, match=r"passes .*" + named.replace("(", r"\(").replace(")", r"\)")
                       + " to FullyShardedDataParallel: neither the CPU ranks' fully_shard nor the sim"):
        plan_module.read(_article_08(**changes), "32-true")


def test_a_callable_wrap_policy_is_refused_by_name() -> None:
    from functools import partial

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    with pytest.raises(UnexecutedSetting, match="auto_wrap_policy partial is no torch.distributed.fsdp.wrap._Policy"):
        plan_module.policy_targets(partial(size_based_auto_wrap_policy, min_num_params=10), nn.Linear(2, 2))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 2)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)) * self.scale)


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A process group of one CPU rank over gloo, as each of the CPU ranks has (fully_shard needs one)."""
    import torch.distributed as dist

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_shard_executes_lightnings_configuration_with_fully_shard(one_rank) -> None:
    """Each unit of the policy (its checkpoint wrapper) and the root are FSDP2 groups under Lightning's
    MixedPrecision; the root casts its inputs, the units do not (FSDP1's cast_root_forward_inputs); the floating
    buffer is cast to buffer_dtype; and a step trains."""
    from lightning.fabric.strategies.fsdp import FSDPStrategy
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule

    from memclaims.techniques.base import StrategyPlan

    read = plan_module.read(FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}), "bf16-mixed")
    plan = StrategyPlan(world=1, wrap_policy=read.wrap_policy, checkpoint_options=read.checkpoint_options,
                        param_dtype=read.param_dtype, reduce_dtype=read.reduce_dtype, buffer_dtype=read.buffer_dtype,
                        cast_forward_inputs=read.cast_forward_inputs,
                        cast_root_forward_inputs=read.cast_root_forward_inputs, configured_by=read.configured_by)
    model = Net()
    blocks = list(model.blocks)
    assert plan_module.shard(model, plan, None, "toy") is model
    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    assert groups == [model, *model.blocks]  # the root, then each block's checkpoint wrapper
    assert all(isinstance(w, CheckpointWrapper) and w._checkpoint_wrapped_module is b for w, b in zip(model.blocks, blocks))
    policies = [g._get_fsdp_state()._mp_policy for g in groups]  # type: ignore[operator]
    assert all((p.param_dtype, p.reduce_dtype) == (torch.bfloat16, torch.bfloat16) for p in policies)
    assert [p.cast_forward_inputs for p in policies] == [True, False, False]
    assert model.scale.dtype == torch.bfloat16
    out = model(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16  # computed from the bf16 all-gathered parameters
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())  # the fp32 shards'


def test_shard_refuses_a_policy_that_selects_nothing(one_rank) -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from memclaims.core.errors import UsageError
    from memclaims.techniques.base import StrategyPlan

    plan = StrategyPlan(world=1, wrap_policy=ModuleWrapPolicy({nn.Conv2d}), configured_by="Lightning")
    with pytest.raises(UsageError, match=r"toy: Lightning's auto-wrap policy ModuleWrapPolicy\(\{Conv2d\}\) selects no"):
        plan_module.shard(Net(), plan, None, "toy")
