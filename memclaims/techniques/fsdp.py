"""fsdp and FSDP1's other sharding strategies (article 08; issue #27), and FSDP2's (``fsdp2.py``): one ``Fsdp``
strategy per entry, configured by its sharding strategy and its API. It owns what the ranks execute (``plan``:
wrap, reshard, device mesh; the techniques that combine with it add checkpointing, offload and notes), Lightning's
``FSDPStrategy`` or ``ModelParallelStrategy`` on CUDA ranks, ``fully_shard`` over gloo on CPU ranks (Lightning
refuses FSDP on the CPU; ``parallelize``), what a rank's Record says ran, the sim's replay (``memclaims.sim.sharded``),
the sharding arithmetic every engine shares, and the active check of what a rank holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from memclaims.core.errors import UsageError
from memclaims.techniques.base import (
    FSDP1_API,
    FSDP2_API,
    TRUE_HALF_PRECISIONS,
    Removal,
    Say,
    Strategy,
    StrategyPlan,
    Technique,
)

if TYPE_CHECKING:
    from lightning.fabric.strategies import Strategy as FabricStrategy
    from lightning.fabric.strategies.fsdp import _SHARDING_STRATEGY
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.workloads.types import Workload

# HYBRID_SHARD shards within a node and replicates across nodes; on one machine it is FULL_SHARD unless
# the ranks are split into nodes by a device mesh. memclaims splits them into this many "nodes" (a
# (replicate, shard) mesh of (HYBRID_NODES, N / HYBRID_NODES)) on every engine, so the technique differs
# from fsdp on one machine: a rank holds HYBRID_NODES / N of the model.
HYBRID_NODES = 2
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def _uneven_nodes(sharding: str | None, world: int) -> str | None:
    """Why ``world`` ranks cannot split into HYBRID_SHARD's simulated nodes, or None."""
    if sharding == "HYBRID_SHARD" and world % HYBRID_NODES:
        return (f"HYBRID_SHARD over {HYBRID_NODES} simulated nodes needs a number of ranks divisible by {HYBRID_NODES} "
                f"(got {world})")
    return None


def shard_group_size(sharding: str | None, world: int) -> int:
    """How many ranks share one copy of the model, each holding a 1/size shard, under ``sharding``
    (None: FULL_SHARD) on ``world`` ranks: all of them, one (NO_SHARD), or one simulated node (HYBRID_SHARD)."""
    if sharding == "NO_SHARD":
        return 1
    if sharding == "HYBRID_SHARD":
        uneven = _uneven_nodes(sharding, world)
        if uneven:
            raise UsageError(uneven)
        return world // HYBRID_NODES
    return world


def fsdp2_mesh(sharding: str, world: int) -> tuple[int, ...] | None:
    """The (replicate, shard) device mesh FSDP2 runs ``sharding`` over on ``world`` ranks: (N, 1) for NO_SHARD and
    (HYBRID_NODES, N / HYBRID_NODES) for HYBRID_SHARD (torch lets the CPU ranks form one over gloo); None: one
    dimension."""
    if sharding in ("NO_SHARD", "HYBRID_SHARD"):
        group = shard_group_size(sharding, world)
        return (world // group, group)
    return None


def reshard_after_forward(sharding: str | None) -> bool:
    """FSDP2's ``fully_shard(reshard_after_forward=...)`` for a sharded technique's ``sharding`` (None:
    FULL_SHARD): False for SHARD_GRAD_OP (the unsharded parameters stay from the forward through the
    backward), True otherwise."""
    return sharding != "SHARD_GRAD_OP"


# FSDP per rank: parameters, gradients and (Adam's) optimizer state are 1/G of the model's, G the ranks that
# share one copy (``shard_group_size``: N, 1 for NO_SHARD, one simulated node's for HYBRID_SHARD). Padding adds
# to it: FSDP2 pads each parameter's dim 0 to a multiple of G (the smoke ViT: +1.4 % over 2 ranks, +9.1 % over
# 4: 21,420 B for 19,626 B), FSDP1 each flat parameter by under G elements. 25 % covers the padding and stays
# far from the factor 2 between one strategy's share and the next's.
FSDP_SHARE_SLACK = 1.25

# What FSDP2 does for each FSDP1 sharding strategy on the CPU ranks (fully_shard's keywords, the plan's mesh).
FSDP2_SHARDINGS = {
    "SHARD_GRAD_OP": "reshard_after_forward=False (the gathered parameters stay until after the backward)",
    "NO_SHARD": "HSDP over a (replicate N, shard 1) device mesh: every rank holds the whole model, gradients "
                "all-reduced",
    "HYBRID_SHARD": f"HSDP over a (replicate {HYBRID_NODES}, shard N/{HYBRID_NODES}) device mesh: "
                    f"{HYBRID_NODES} simulated nodes",
}


@dataclass(frozen=True)
class Fsdp(Strategy):
    """One FSDP technique: FSDP1's ``sharding_strategy`` (FSDP2's: FULL_SHARD is reshard_after_forward=True,
    SHARD_GRAD_OP False) and which FSDP it asks for (``api``: on CUDA FSDP1 is Lightning's FSDPStrategy, FSDP2
    its ModelParallelStrategy; the CPU ranks run fully_shard for both; the sim replays the one asked for)."""

    sharding_strategy: str = "FULL_SHARD"
    api: str = FSDP1_API

    lightning_devices = ("cuda",)  # Lightning refuses FSDP on the CPU: the CPU ranks' engine runs fully_shard
    sim_replay = "memclaims.sim.replays.sharded:ShardedReplay"
    shards_parameters = True
    block_policies = True

    def plan(self, recipe: Recipe, world: int) -> StrategyPlan:
        """FSDP2 on the CPU ranks runs NO_SHARD and HYBRID_SHARD as HSDP over a (replicate, shard) device mesh of
        (N, 1) and (HYBRID_NODES, N / HYBRID_NODES) (torch lets the CPU ranks form one over gloo: HYBRID_SHARD's
        simulated nodes); FSDPStrategy takes HYBRID_SHARD's as its ``device_mesh``."""
        mesh = fsdp2_mesh(self.sharding_strategy, world)
        fsdp1 = self.api == FSDP1_API
        return StrategyPlan(world=world, fsdp_api=self.api, sharding_strategy=self.sharding_strategy,
                            reshard_after_forward=reshard_after_forward(self.sharding_strategy), mesh_shape=mesh,
                            mesh_dim_names=("replicate", "shard") if mesh else (),
                            wrap_blocks=recipe.workload.fsdp_auto_wrap, setup_moves_model=fsdp1,
                            mixed_precision_policy=fsdp1)

    def rank_refusal(self, recipe: Recipe, device: str, world: int) -> str | None:
        return _uneven_nodes(self.sharding_strategy, world)  # the mesh needs the ranks to split into the nodes

    def lightning_strategy(self, plan: StrategyPlan, recipe: Recipe, device: str) -> str | FabricStrategy:
        """Scripts 08/09/11: Lightning's ``FSDPStrategy``, wrapping and checkpointing the workload's block,
        optionally offloading to the CPU, with the recipe's sharding strategy (FULL_SHARD, the article's, unless a
        technique of issue #27 says otherwise; HYBRID_SHARD with the plan's device mesh: without one, one node's
        HYBRID_SHARD is FULL_SHARD). FSDP2 (issue #27): ``ModelParallelStrategy`` with every rank data-parallel
        (``data_parallel_size`` = the world, ``tensor_parallel_size=1``) and ``Fsdp2Parallelize``."""
        block = recipe.workload.block_class()
        if self.api == FSDP2_API:
            from lightning.fabric.strategies.model_parallel import ModelParallelStrategy

            from memclaims.techniques.impl.fully_shard import Fsdp2Parallelize

            parallelize = Fsdp2Parallelize(block=block, reshard_after_forward=plan.reshard_after_forward,
                                           checkpointing=plan.checkpoint_blocks, auto_wrap=plan.wrap_blocks,
                                           workload=recipe.workload.name)
            return ModelParallelStrategy(parallelize_fn=parallelize, data_parallel_size=plan.world,
                                         tensor_parallel_size=1)
        from lightning.fabric.strategies.fsdp import FSDPStrategy

        mesh: dict[str, Any] = {"device_mesh": plan.mesh_shape} if self.sharding_strategy == "HYBRID_SHARD" else {}
        return FSDPStrategy(
            auto_wrap_policy={block} if plan.wrap_blocks else None,
            activation_checkpointing_policy={block} if plan.checkpoint_blocks else None,
            cpu_offload=plan.offload_params,
            sharding_strategy=cast("_SHARDING_STRATEGY", plan.sharding_strategy),
            **mesh,
        )

    def configured(self, plan: StrategyPlan, recipe: Recipe, precision: str) -> StrategyPlan:
        """FSDP1 (``api`` fsdp1): what Lightning's ``FSDPStrategy``, as ``lightning_strategy`` builds it for the CUDA
        ranks, and the ``FSDPPrecision(precision)`` Fabric's connector pairs with it would pass to FSDP, read without
        launching them (memclaims.techniques.impl.lightning_fsdp_plan): its MixedPrecision, auto-wrap policy,
        activation checkpointing, CPUOffload, sharding strategy and device mesh replace the plan's (FSDP2's
        ``reshard_after_forward`` and mesh follow from the sharding strategy Lightning passes). FSDP2
        (ModelParallelStrategy with memclaims' own parallelize_fn): the plan as it is."""
        if self.api != FSDP1_API:
            return plan
        from memclaims.techniques.impl import lightning_fsdp_plan

        try:
            read = lightning_fsdp_plan.read(self.lightning_strategy(plan, recipe, "cuda"), precision)
        except lightning_fsdp_plan.UnexecutedSetting as error:
            raise lightning_fsdp_plan.UnexecutedSetting(f"{recipe.id}: {error}") from None
        sharding = read.sharding_strategy
        if sharding not in SHARDINGS:
            raise lightning_fsdp_plan.UnexecutedSetting(f"{recipe.id}: {read.configured_by} passes sharding_strategy "
                                                        f"{sharding}: the engines here run {', '.join(SHARDINGS)}")
        mesh = read.device_mesh or fsdp2_mesh(sharding, plan.world)
        return replace(plan, sharding_strategy=sharding, reshard_after_forward=reshard_after_forward(sharding),
                       mesh_shape=mesh, mesh_dim_names=("replicate", "shard") if mesh else (),
                       wrap_blocks=read.wrap_policy is not None, wrap_policy=read.wrap_policy,
                       checkpoint_blocks=bool(read.checkpoint_options), checkpoint_options=read.checkpoint_options,
                       offload_params=read.offload_params, param_dtype=read.param_dtype, reduce_dtype=read.reduce_dtype,
                       buffer_dtype=read.buffer_dtype, cast_forward_inputs=read.cast_forward_inputs,
                       cast_root_forward_inputs=read.cast_root_forward_inputs, configured_by=read.configured_by)

    def configuration_problems(self, recipe: Recipe, asked: StrategyPlan, configured: StrategyPlan) -> list[str]:
        """What of the recipe's plan (``asked``, what memclaims passes to Lightning's strategy) the plan Lightning
        configured (``configured``) does not carry, one line each: the recipe, the setting, and where FSDP takes it
        (the setup phase: what ``FSDPStrategy.setup_module`` passes to ``FullyShardedDataParallel``). What no run on
        the CPU can show (CPU offload) is held here; the rest shows in what the ranks measure too."""
        if not configured.configured_by:
            return []
        settings = [("auto_wrap_policy (a unit per block)", asked.wrap_blocks, configured.wrap_blocks),
                    ("activation_checkpointing_policy (each block)", asked.checkpoint_blocks, configured.checkpoint_blocks),
                    ("cpu_offload.offload_params", asked.offload_params, configured.offload_params),
                    ("sharding_strategy", asked.sharding_strategy, configured.sharding_strategy),
                    ("device_mesh", asked.mesh_shape, configured.mesh_shape)]
        return [f"{recipe.id}@{asked.world}, every rank: {setting} is {got!r} as {configured.configured_by} configure "
                f"it, where the recipe asks {wanted!r} (phase setup: what FSDPStrategy.setup_module passes to "
                "FullyShardedDataParallel)" for setting, wanted, got in settings if wanted != got]

    def parallelize(self, plan: StrategyPlan, model: nn.Module, mesh: DeviceMesh | None, workload: Workload) -> nn.Module:
        """A plan Lightning configured (``configured``): its configuration executed with FSDP2's ``fully_shard``
        (memclaims.techniques.impl.lightning_fsdp_plan.shard). Otherwise (FSDP2 as asked): FSDP2's ``fully_shard`` on
        each block with the plan's ``reshard_after_forward`` (and mesh), then on the root with FSDP2's own (and the
        mesh)."""
        if plan.configured_by:
            from memclaims.techniques.impl import lightning_fsdp_plan

            return lightning_fsdp_plan.shard(model, plan, mesh, workload.name)
        from memclaims.techniques.impl.fully_shard import fully_shard_blocks

        on_mesh = {} if mesh is None else {"mesh": mesh}
        return fully_shard_blocks(model, workload.block_class(), checkpointing=plan.checkpoint_blocks,
                                  auto_wrap=plan.wrap_blocks, workload=workload.name,
                                  block_options={"reshard_after_forward": plan.reshard_after_forward, **on_mesh},
                                  root_options=on_mesh)

    def rank_notes(self, plan: StrategyPlan, rank: int, device: str) -> list[str]:
        if device in self.lightning_devices:
            if self.api == FSDP2_API:
                return [f"rank {rank} of {plan.world}: Lightning ModelParallelStrategy (FSDP2 fully_shard, "
                        f"reshard_after_forward={plan.reshard_after_forward})"]
            return [f"rank {rank} of {plan.world}: Lightning strategy='fsdp'"]
        notes = [f"rank {rank} of {plan.world}: FSDP2 fully_shard over gloo on the CPU (Lightning refuses FSDP on "
                 "the CPU)"]
        if self.api == FSDP2_API:
            notes.append(f"FSDP2 as asked (fully_shard, reshard_after_forward={plan.reshard_after_forward} on each "
                         "block, FSDP2's default, False, on the root)")
        elif plan.sharding_strategy != "FULL_SHARD":
            notes.append(f"{plan.sharding_strategy} as FSDP2 runs it: {FSDP2_SHARDINGS[plan.sharding_strategy]}")
        if plan.configured_by:
            from memclaims.techniques.impl import lightning_fsdp_plan

            notes.append(lightning_fsdp_plan.describe(plan))
        return notes

    def removes(self, after: Record) -> Removal | None:
        if after.devices < 2:
            return Removal(no_verdict=f"FSDP over {after.devices} device shards nothing: needs 2 devices")
        return Removal(state=1 / after.devices, rest=1 / after.devices, why=f"{after.devices} ranks divide both")

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """Is the recipe's FSDP sharding strategy the one that ran? What each strategy keeps per rank:
        FULL_SHARD and SHARD_GRAD_OP 1/N of the model state, NO_SHARD all of it, HYBRID_SHARD 1/(N/nodes);
        SHARD_GRAD_OP every parameter still gathered after the forward, the others (with a wrap policy) the
        root's only."""
        if record.devices == 1 or recipe.distributed is not self:
            return  # another strategy runs the ranks and checks what they hold (tensor-parallel's 2-D plan)
        sharding, world = self.sharding_strategy, record.devices
        group = shard_group_size(sharding, world)
        whole = record.param_count * (2 if record.precision in TRUE_HALF_PRECISIONS else 4)
        on_device = not recipe.strategy_plan(world).offload_params  # offload keeps the shards and their state on the host
        what = "the whole model's" if group == 1 else f"1/{group} of the model's"
        terms = [("param_bytes", 1, "model weights", "phase load (after setup)")]
        if recipe.optimizer in ("adam", "adamw"):
            terms.append(("optimizer_state_bytes", 2, "Adam state (two moments)", "phase optimizer_step"))
        for field_name, copies, noun, when in terms:
            held, share = getattr(record, field_name), copies * whole / group
            steps = 4 * record.param_tensor_count if field_name == "optimizer_state_bytes" else 0  # Adam's step scalars
            low = share / FSDP_SHARE_SLACK if on_device else 0
            if not low <= held <= share * FSDP_SHARE_SLACK + steps:
                say(f"rank {record.rank} holds {field_name} {held:,} B after {when}, not {what} {noun} "
                    f"({share:,.0f} B within {FSDP_SHARE_SLACK - 1:.0%}): {sharding} over {world} ranks "
                    f"shards them over {group}")
        if record.grad_bytes > whole / group * FSDP_SHARE_SLACK:
            say(f"rank {record.rank} holds grad_bytes {record.grad_bytes:,} B after phase backward, above {what} "
                f"gradients ({whole / group:,.0f} B): {sharding} over {world} ranks shards them over {group}")
        # FSDP2 (fsdp2, fsdp2-no-reshard): fully_shard must be what ran, wherever it runs (on CPU ranks every
        # FSDP technique runs it; the sim and CUDA run FSDP1 for the others).
        fsdp2 = self.api == FSDP2_API
        if fsdp2 and record.fsdp_api != FSDP2_API:
            say(f"fsdp_api is {record.fsdp_api!r} after phase load, not 'fsdp2': FSDP2's fully_shard did not "
                "shard the model (FSDP1's flat parameters, or no FSDP, ran instead)")
        # The reshard setting, in the words of the API that runs it.
        kept, resharded = (("reshard_after_forward=False", "reshard_after_forward=True") if fsdp2 else
                           ("SHARD_GRAD_OP", sharding))
        gathered = record.forward_unsharded_params
        if gathered is None:
            if record.device != "cuda":  # Lightning's FSDPStrategy on CUDA ranks is not observed there
                say("forward_unsharded_params was not observed after phase forward")
            return
        if sharding == "SHARD_GRAD_OP" and gathered < record.param_count:
            say(f"forward_unsharded_params is {gathered:,} of {record.param_count:,} parameters after phase "
                f"forward: {kept} keeps every parameter gathered from the forward through the backward "
                "(the blocks were resharded after their forward, as FULL_SHARD does)")
        if sharding in ("FULL_SHARD", "HYBRID_SHARD") and recipe.workload.fsdp_auto_wrap and gathered >= record.param_count:
            say(f"forward_unsharded_params is {gathered:,} of {record.param_count:,} parameters after phase "
                f"forward: {resharded} reshards each wrapped block after its forward (only the root stays "
                "gathered)")


# Multi-device, on top of the fp32 01-2 script; run by memclaims.measure.distributed (FSDP2 over gloo
# on the CPU, Lightning's FSDPStrategy on CUDA).
ENTRY = Technique("fsdp", "fully sharded data parallel, auto-wrapped on the transformer block",
                  "08_fsdp-with-01-2", group="strategy", hooks=Fsdp())
# FSDP's other sharding strategies (issue #27), the same wrap as fsdp; outside the default selection's
# cover. The article's CPU offload and delayed init (09, 11) build on FULL_SHARD only: they ``need`` fsdp.
SHARD_GRAD_OP = Technique(
    "fsdp-shard-grad-op", "FSDP SHARD_GRAD_OP (ZeRO-2-like): gradients and optimizer state sharded, parameters "
    "all-gathered before the forward and kept unsharded until after the backward",
    "torch docs: ShardingStrategy.SHARD_GRAD_OP", group="strategy", in_cover=False, hooks=Fsdp("SHARD_GRAD_OP"))
NO_SHARD = Technique(
    "fsdp-no-shard", "FSDP NO_SHARD (DDP-like): parameters, gradients and optimizer state whole on every rank, "
    "gradients all-reduced", "torch docs: ShardingStrategy.NO_SHARD", group="strategy", in_cover=False,
    hooks=Fsdp("NO_SHARD"))
HYBRID = Technique(
    "fsdp-hybrid", f"FSDP HYBRID_SHARD over {HYBRID_NODES} simulated nodes: FULL_SHARD within each "
    f"1/{HYBRID_NODES} of the ranks, replicated across them (device mesh (replicate {HYBRID_NODES}, "
    f"shard N/{HYBRID_NODES}))", "torch docs: ShardingStrategy.HYBRID_SHARD", group="strategy", in_cover=False,
    hooks=Fsdp("HYBRID_SHARD"))
ENTRIES = (ENTRY, SHARD_GRAD_OP, NO_SHARD, HYBRID)
