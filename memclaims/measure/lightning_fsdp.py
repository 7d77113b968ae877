"""Lightning Fabric for the ranks of a multi-device recipe: FSDP on CUDA ranks (article scripts 08, 09, 11; FSDP2
through ``ModelParallelStrategy``, issue #27), DDP and DeepSpeed (the LLM bonus "before" scripts) on CUDA or CPU
ranks, each with the Lightning strategy its technique builds (``memclaims.techniques.base.Strategy``).

The processes come from ``memclaims.measure.launcher`` (or torchrun), which sets torchrun's variables, so
Fabric's own launcher sees processes created externally and starts none; each rank then runs the
Fabric engine (``memclaims.measure.runner``) with the Fabric built here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from memclaims.core.errors import UsageError
from memclaims.measure import launcher
from memclaims.recipes.run_options import RunOptions, default_devices

if TYPE_CHECKING:
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
    from lightning.fabric.strategies import Strategy as FabricStrategy

    from memclaims.recipes.recipe import Recipe


def strategy(recipe: Recipe, world: int | None = None, device: str = "cuda") -> str | FabricStrategy:
    """Lightning's strategy of a multi-device recipe on ``world`` ranks (None: every GPU, or the CPU's default):
    the recipe's strategy builds it from its plan (``Strategy.lightning_strategy``)."""
    chosen = recipe.distributed
    if chosen is None:
        raise UsageError(f"{recipe.id} runs on one device: it has no Lightning strategy")
    return chosen.lightning_strategy(recipe.strategy_plan(world or default_devices(device)), recipe, device)


def sharded_fabric(recipe: Recipe, options: RunOptions) -> Fabric:
    """The Fabric one rank of a multi-device run uses (CUDA ranks; CPU ranks for DDP and DeepSpeed)."""
    from lightning.fabric import Fabric

    world = options.devices or default_devices(options.device)
    # torchrun across nodes: Fabric counts devices per node.
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    environment = cluster_environment()
    fabric = Fabric(accelerator=options.device, devices=per_node, num_nodes=max(1, world // per_node),
                    strategy=strategy(recipe, world, options.device), precision=cast("_PRECISION_INPUT", recipe.precision),
                    plugins=[environment] if environment is not None else None)
    # The processes exist already (LOCAL_RANK is set): launch() only joins the group and picks
    # this rank's GPU.
    fabric.launch()
    return fabric


def cluster_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment | None:
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


def environment_report(rank: int, world: int) -> dict[str, object]:
    """What one spawned rank sees: left-over SLURM variables, and the cluster environment and ranks
    Lightning Fabric sets up with memclaims' choice (a rank function for launcher.launch)."""
    from lightning.fabric import Fabric

    chosen = cluster_environment()
    fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp",
                    plugins=[chosen] if chosen is not None else None)
    return {"rank": rank, "slurm": sorted(k for k in os.environ if k.startswith("SLURM_")),
            "environment": type(fabric.strategy.cluster_environment).__name__,  # type: ignore[attr-defined]
            "global_rank": fabric.global_rank, "local_rank": fabric.local_rank, "world_size": fabric.world_size}
