"""Lightning Fabric's strategies for the ranks of a multi-device recipe: FSDP on CUDA ranks (article
scripts 08, 09, 11; FSDP2 through ``ModelParallelStrategy``, issue #27), DDP and DeepSpeed (the LLM bonus
"before" scripts) on CUDA or CPU ranks.

The processes come from ``memclaims.measure.launcher`` (or torchrun), which sets torchrun's variables, so
Fabric's own launcher sees processes created externally and starts none; each rank then runs the
Fabric engine (``memclaims.measure.runner``) with the Fabric built here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from memclaims.core.errors import UsageError
from memclaims.measure import launcher
from memclaims.recipes.run_options import RunOptions, default_devices

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe


def fully_shard_blocks(model: nn.Module, block: type[nn.Module], *, checkpointing: bool, auto_wrap: bool,
                       workload: str, block_options: Mapping[str, Any], root_options: Mapping[str, Any]) -> nn.Module:
    """FSDP2 as memclaims applies it, on CPU ranks (memclaims.measure.distributed) and in ModelParallelStrategy's
    parallelize_fn alike: activation checkpointing around each ``block`` (non-reentrant, as Lightning's policy),
    ``fully_shard(**block_options)`` on each block's outermost module (the checkpoint wrapper when there is
    one), then ``fully_shard(model, **root_options)`` on the root: embeddings, final norm and head (all of it
    without auto-wrap)."""
    from torch.distributed.fsdp import fully_shard

    if checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, block))
    if auto_wrap:
        if not any(isinstance(m, block) for m in model.modules()):
            raise UsageError(f"{workload} has no {block.__name__} to shard")
        for module in model.modules():
            inner = getattr(module, "_checkpoint_wrapped_module", module)
            if isinstance(inner, block) and (module is inner) != checkpointing:
                fully_shard(module, **block_options)
    fully_shard(model, **root_options)
    return model


@dataclass(frozen=True)
class Fsdp2Parallelize:
    """``ModelParallelStrategy``'s ``parallelize_fn`` for an FSDP2 recipe: ``fully_shard`` on each of the
    workload's blocks with the recipe's ``reshard_after_forward``, then on the root (``reshard_after_forward``
    left to FSDP2: False for the root), over the device mesh's ``data_parallel`` dimension."""

    block: type[nn.Module]
    reshard_after_forward: bool
    checkpointing: bool
    auto_wrap: bool
    workload: str

    def __call__(self, model: nn.Module, device_mesh: Any) -> nn.Module:
        mesh = device_mesh["data_parallel"]
        return fully_shard_blocks(model, self.block, checkpointing=self.checkpointing, auto_wrap=self.auto_wrap,
                                  workload=self.workload,
                                  block_options={"mesh": mesh, "reshard_after_forward": self.reshard_after_forward},
                                  root_options={"mesh": mesh})


def model_parallel_strategy(recipe: Recipe, world: int | None = None) -> Any:
    """FSDP2 on CUDA (issue #27): Lightning's ``ModelParallelStrategy`` with every rank data-parallel
    (``data_parallel_size`` = the world, ``tensor_parallel_size=1``) and ``Fsdp2Parallelize``."""
    from lightning.fabric.strategies.model_parallel import ModelParallelStrategy

    from memclaims.techniques.technique_registry import reshard_after_forward

    world = world or default_devices("cuda")
    parallelize = Fsdp2Parallelize(block=recipe.workload.block_class(),
                                   reshard_after_forward=reshard_after_forward(recipe.sharding),
                                   checkpointing=recipe.activation_checkpointing,
                                   auto_wrap=recipe.workload.fsdp_auto_wrap, workload=recipe.workload.name)
    return ModelParallelStrategy(parallelize_fn=parallelize, data_parallel_size=world, tensor_parallel_size=1)


def fsdp_strategy(recipe: Recipe, world: int | None = None) -> Any:
    """Scripts 08/09/11: wrap and checkpoint the workload's block, optionally offload to the CPU; the
    recipe's sharding strategy (FULL_SHARD, the article's, unless a technique of issue #27 says otherwise).
    HYBRID_SHARD gets the device mesh (replicate HYBRID_NODES, shard ``world`` / HYBRID_NODES): the ranks
    of one machine split into simulated nodes (without a mesh, one node's HYBRID_SHARD is FULL_SHARD)."""
    from lightning.fabric.strategies.fsdp import FSDPStrategy

    from memclaims.techniques.technique_registry import shard_group_size

    block = recipe.workload.block_class()
    sharding = recipe.sharding or "FULL_SHARD"
    mesh: dict[str, Any] = {}
    if sharding == "HYBRID_SHARD":
        world = world or default_devices("cuda")
        group = shard_group_size(sharding, world)
        mesh["device_mesh"] = (world // group, group)
    return FSDPStrategy(
        auto_wrap_policy={block} if recipe.workload.fsdp_auto_wrap else None,
        activation_checkpointing_policy={block} if recipe.activation_checkpointing else None,
        cpu_offload=recipe.cpu_offload,
        sharding_strategy=cast(Any, sharding),
        **mesh,
    )


def strategy(recipe: Recipe, world: int | None = None, device: str = "cuda") -> Any:
    """Lightning's strategy of a multi-device recipe, configured as the article's scripts do: FSDP as
    above (FSDP2: ``model_parallel_strategy``); ``"ddp"`` and ``"deepspeed_stage_2"`` by name, with Lightning's defaults (DDP: torch's 25 MiB
    buckets, ``gradient_as_bucket_view=False``; DeepSpeed: memclaims.sim.zero.LIGHTNING_DEFAULTS)."""
    if recipe.sharded and recipe.fsdp2:
        return model_parallel_strategy(recipe, world)
    if recipe.sharded:
        return fsdp_strategy(recipe, world)
    if recipe.strategy == "ddp":
        from lightning.fabric.strategies import DDPStrategy

        ddp: dict[str, Any] = {}
        if recipe.workload.unused_parameters:
            # Only where the workload leaves parameters without gradients (BigBird's pooler): the script's
            # plain "ddp" fails there at the second step ("Expected to have finished reduction in the prior
            # iteration"); the search for them walks the autograd graph each step and allocates nothing.
            ddp["find_unused_parameters"] = True
        if device == "cpu":
            ddp["init_sync"] = False  # the states are broadcast in place instead (techniques.distributed_data_parallel)
        return DDPStrategy(**ddp) if ddp else "ddp"
    return recipe.strategy


def sharded_fabric(recipe: Recipe, options: RunOptions) -> Any:
    """The Fabric one rank of a multi-device run uses (CUDA ranks; CPU ranks for DDP and DeepSpeed)."""
    from lightning.fabric import Fabric

    world = options.devices or default_devices(options.device)
    # torchrun across nodes: Fabric counts devices per node.
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    environment = cluster_environment()
    fabric = Fabric(accelerator=options.device, devices=per_node, num_nodes=max(1, world // per_node),
                    strategy=strategy(recipe, world, options.device), precision=cast(Any, recipe.precision),
                    plugins=[environment] if environment is not None else None)
    # The processes exist already (LOCAL_RANK is set): launch() only joins the group and picks
    # this rank's GPU.
    fabric.launch()
    return fabric


def cluster_environment(environ: Mapping[str, str] | None = None) -> Any:
    """The Lightning cluster environment of a rank, chosen here rather than detected by Lightning.

    Lightning tries SLURMEnvironment first; inside a SLURM allocation it would win for ranks that
    memclaims spawned (every rank global rank 0) and for torchrun's workers (SLURM_PROCID is the
    srun task, not the worker). Spawned ranks: LightningEnvironment (RANK/LOCAL_RANK set by
    memclaims.measure.launcher); torchrun: TorchElasticEnvironment; otherwise None (Lightning decides).
    """
    env = os.environ if environ is None else environ
    if env.get(launcher.SPAWNED_RANK_ENV):
        from lightning.fabric.plugins.environments.lightning import LightningEnvironment

        return LightningEnvironment()
    if env.get("TORCHELASTIC_RUN_ID") is not None or launcher.torchrun_env(env) is not None:
        from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment

        return TorchElasticEnvironment()
    return None


def environment_report(rank: int, world: int) -> dict[str, Any]:
    """What one spawned rank sees: left-over SLURM variables, and the cluster environment and ranks
    Lightning Fabric sets up with memclaims' choice (a rank function for launcher.launch)."""
    from lightning.fabric import Fabric

    chosen = cluster_environment()
    fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp",
                    plugins=[chosen] if chosen is not None else None)
    return {"rank": rank, "slurm": sorted(k for k in os.environ if k.startswith("SLURM_")),
            "environment": type(fabric.strategy.cluster_environment).__name__,  # type: ignore[attr-defined]
            "global_rank": fabric.global_rank, "local_rank": fabric.local_rank, "world_size": fabric.world_size}
