"""The FSDP replay (``sharded``): rank 0 of a recipe's FSDP1 or FSDP2 run by per-rank accounting on fake tensors
(memclaims.sim.sharded models what FSDP allocates)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import memclaims.sim.sharded as sharded
from memclaims.core.errors import UsageError
from memclaims.core.precision import PRECISIONS
from memclaims.sim.replay import (
    PhaseResult,
    Replay,
    ReplayRequest,
    Session,
    SimPrecision,
    attention_context,
    default_dtype,
    implementation_notes,
    model_counts,
    model_fns,
    move,
    opening,
    out_of_memory,
    tf32_matmul,
    trained_record,
)
from memclaims.techniques.base import FSDP2_API, ON_SIM
from memclaims.techniques.impl import lightning_fsdp_plan

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe


def check(recipe: Recipe) -> None:
    """Raise UsageError, with the reason, for an FSDP recipe the per-rank accounting cannot replay."""
    sharded.check(recipe)


def replay(recipe: Recipe, request: ReplayRequest) -> Record:
    """Rank 0 of the recipe's FSDP1 run, or FSDP2's (the plan's ``fsdp_api``), by memclaims.sim.sharded: per-rank
    accounting on fake tensors, of the recipe's plan (``Recipe.strategy_plan``) as Lightning's strategy configures it
    (``Strategy.configured``: FSDP1's is what Lightning's FSDPStrategy and FSDPPrecision would pass to FSDP)."""
    chosen, limit_bytes = request.profile, request.limit_bytes
    steps, notes = opening(recipe, request)
    if request.allocator_events is not None:
        raise UsageError(f"{recipe.id}: the allocator history is recorded for one-device recipes only")
    build, inputs_fn = model_fns(recipe)
    world = request.devices or sharded.WORLD_SIZE
    strategy = recipe.distributed
    assert strategy is not None  # a sharded replay
    plan = strategy.configured(recipe.strategy_plan(world), recipe, recipe.precision)
    fsdp2 = plan.fsdp_api == FSDP2_API
    shard_dtype = PRECISIONS[recipe.precision].param_dtype
    if plan.mixed_precision_policy and chosen.lightning_era != "installed":
        # The article's 2023 Lightning's FSDPPrecision (sharded.LIGHTNING_2023_FSDP_DTYPES: "*-mixed" all-gathered in
        # fp32); its other settings are the ones the installed Lightning configures for the same arguments.
        param_dtype, reduce_dtype = sharded.mixed_precision_dtypes(recipe.precision, chosen.lightning_era)
    elif plan.configured_by:  # the MixedPrecision the installed Lightning's FSDPStrategy + FSDPPrecision configure
        param_dtype = lightning_fsdp_plan.dtype(plan.param_dtype) or shard_dtype
        reduce_dtype = lightning_fsdp_plan.dtype(plan.reduce_dtype) or param_dtype
    else:  # every collective in the parameters' dtype
        param_dtype = reduce_dtype = shard_dtype
    if fsdp2:
        # ModelParallelStrategy with memclaims' parallelize_fn: no MixedPrecisionPolicy; reshard_after_forward is the plan's.
        notes.append(f"FSDP2 rank 0 of {world} (per-rank accounting, memclaims.sim.sharded): {sharded.FSDP2_NOTE}; "
                     f"reshard_after_forward={plan.reshard_after_forward} on each block (the root: "
                     f"False, fully_shard's default for the root); shards, all-gathers and reduce-scatters in "
                     f"{shard_dtype} (no MixedPrecisionPolicy); not modelled: {sharded.UNMODELLED['nccl']}; "
                     f"{sharded.UNMODELLED['evaluation']}")
    else:
        lightning = "installed" if chosen.lightning_era == "installed" else f"{chosen.lightning_era}-era"
        notes.append(f"FSDP1 rank 0 of {world} (per-rank accounting, memclaims.sim.sharded): shards in {shard_dtype}, "
                     f"all-gathers in {param_dtype}, reduce-scatters in {reduce_dtype} ({lightning} Lightning's "
                     f"FSDPPrecision); not modelled: " + "; ".join(
                         v for k, v in sharded.UNMODELLED.items() if not (k == "record_stream" and chosen.timeline)))
        if plan.sharding_strategy != "FULL_SHARD":
            notes.append(f"sharding_strategy {plan.sharding_strategy}: {sharded.SHARDING_NOTES[plan.sharding_strategy]}")
    if not fsdp2 and not sharded.limit_all_gathers(chosen.optimizer_era):
        notes.append("limit_all_gathers=False (FSDP1's default before pytorch PR #104900): " + (
            "the unsharded buffers freed with record_stream wait for the GPU on the timeline (memclaims.sim.timeline)"
            if chosen.timeline else "the forward's all-gather buffers stay taken until the first pre-backward hook "
            "(memclaims.sim.sharded._RunAhead)"))
    notes.extend(plan.notes_on(ON_SIM))
    notes.extend(implementation_notes(recipe, chosen))
    session = Session(chosen, limit_bytes)
    session.memory.tf32_matmul = tf32_matmul(recipe)
    phases: dict[str, PhaseResult] = {}
    torch.manual_seed(0)
    with out_of_memory(recipe, chosen, limit_bytes, phases), session.active():
        with session.phase(phases, "load"):
            with session.host():
                # Fabric converts true precisions on the host; the unsharded (compute) copy is param_dtype.
                with default_dtype(shard_dtype):
                    model = build(recipe.scale, recipe.workload.num_classes)
            # Fabric.setup moves the model before FSDPStrategy wraps it; ModelParallelStrategy's module_to_device
            # is a no-op: each fully_shard call moves its own group's parameters.
            moved = plan.setup_moves_model
            if moved:
                move(model)
            # The units and checkpointed blocks as Lightning's policies select them (a plan Lightning configured).
            units = checkpointed = None
            if plan.configured_by:
                units = lightning_fsdp_plan.policy_targets(plan.wrap_policy, model)
                checkpointed = lightning_fsdp_plan.checkpoint_targets(plan.checkpoint_options, model)
            wrapped = sharded.wrap(model, recipe.workload.block_class(), session.memory, world=world,
                                   shard_dtype=shard_dtype, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                   offload=plan.offload_params, checkpointing=plan.checkpoint_blocks,
                                   auto_wrap=plan.wrap_blocks, moved=moved,
                                   limit_gathers=sharded.limit_all_gathers(chosen.optimizer_era),
                                   sharding=plan.sharding_strategy, fsdp2=fsdp2, wrap_units=units,
                                   checkpointed=checkpointed)
            if param_dtype != shard_dtype:  # the compute copies the units all-gather (host fakes, uncounted)
                with session.host():
                    move(model, param_dtype)
        counts = model_counts(model)
        precision = SimPrecision(recipe)
        attention = attention_context(chosen, precision.compute)
        with session.phase(phases, "train"), session.training(recipe.workload.name, model):
            states, replayed = sharded.train(session, recipe, wrapped, steps, session.data(inputs_fn), precision,
                                             attention)
        if replayed:
            notes.append(f"{replayed} micro-batches replayed from micro-batch 2's allocations, which matched micro-batch "
                         "1's event for event (memclaims.sim.repeat)")
        site = dict(session.memory.reserved_peak_site)
        del model, wrapped
    return trained_record(recipe, session, site, steps=steps, model_counts=counts, notes=notes,
                          states=states, devices=world, rank=0)


class ShardedReplay(Replay):
    """This module's replay (a strategy names it by ``"memclaims.sim.replays.sharded:ShardedReplay"``)."""

    def check(self, recipe: Recipe) -> None:
        check(recipe)

    def run(self, recipe: Recipe, request: ReplayRequest) -> Record:
        return replay(recipe, request)
