"""The one-device replay (``one-device``): a recipe without a strategy, or with one whose ranks each run the whole
model (DDP: the plan's gradient buckets and notes), on one simulated GPU through the allocator model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import memclaims.sim.ddp as ddp
from memclaims.measure import optimizers
from memclaims.sim.replay import (
    PhaseResult,
    Replay,
    ReplayRequest,
    Session,
    implementation_notes,
    load_recipe_model,
    model_counts,
    model_fns,
    opening,
    out_of_memory,
    readable_eight_bit_layout,
    reference_load_peak,
    tf32_matmul,
    train,
    trained_record,
)
from memclaims.techniques.base import ON_SIM, PYTORCH

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe


def replay(recipe: Recipe, request: ReplayRequest) -> Record:
    """The recipe's load and measured steps on one simulated GPU (with the strategy's plan, where it has one)."""
    chosen, limit_bytes = request.profile, request.limit_bytes
    build, inputs_fn = model_fns(recipe)
    steps, notes = opening(recipe, request)
    plan = recipe.strategy_plan(request.devices or 1) if recipe.distributed is not None else None
    reference = reference_load_peak(recipe, chosen)  # init-module: 07_01's load, to compare with
    if plan is not None:
        notes.extend(plan.notes_on(ON_SIM))
    if recipe.optimizer in optimizers.EIGHT_BIT:
        notes.append(f"{recipe.optimizer}: state from bitsandbytes {readable_eight_bit_layout().version}'s layout "
                     f"(memclaims.sim.eight_bit); the fused step allocates no temporaries")
    if recipe.optimizer == "adafactor":
        notes.append("adafactor: transformers' own step on fake tensors, one parameter at a time (it has no "
                     "foreach path): factored second moment for matrices, no first moment")
    notes.extend(implementation_notes(recipe, chosen))
    session = Session(chosen, limit_bytes)
    session.memory.tf32_matmul = tf32_matmul(recipe)
    session.allocator.events = request.allocator_events
    phases: dict[str, PhaseResult] = {}
    torch.manual_seed(0)
    with out_of_memory(recipe, chosen, limit_bytes, phases), session.active():
        with session.phase(phases, "load"):
            model = load_recipe_model(session, recipe, build)
            for hooks in recipe.hooks:  # activation-checkpointing's wrap, as the real engine's build
                hooks.sim_after_load(model, recipe, notes)
            # fabric.setup under DDP: the Reducer's gradient buckets, alive for the whole run.
            buckets = ddp.allocate_buckets(list(model.parameters())) if plan and plan.bucket_gradients else []
        counts = model_counts(model)
        with session.phase(phases, "train"), session.training(recipe.workload.name, model):
            states = train(session, recipe, model, steps, session.data(inputs_fn))
        site = dict(session.memory.reserved_peak_site)
        del model, buckets
    return trained_record(recipe, session, site, steps=steps, model_counts=counts, notes=notes, states=states,
                          precision="32-true" if recipe.stack == PYTORCH else recipe.precision,
                          reference_load_peak_bytes=reference)


class OneDeviceReplay(Replay):
    """This module's replay (a strategy names it by ``"memclaims.sim.replays.one_device:OneDeviceReplay"``)."""

    def run(self, recipe: Recipe, request: ReplayRequest) -> Record:
        return replay(recipe, request)
