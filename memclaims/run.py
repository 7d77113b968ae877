"""``run_recipe(recipe, options) -> Measurement``: how every caller runs a recipe, on every engine.

It picks the engine and nothing else: the simulated GPU (``memclaims.sim``) for ``--device sim``;
the sharded ranks (``memclaims.measure.distributed``: FSDP2 on CPU ranks, Lightning FSDP on CUDA ranks)
for a sharded recipe or several devices; the stack's own driver (``memclaims.measure.stacks``: the HF Trainer,
Accelerate, Lightning's Trainer) for a recipe of a stack that runs the loop itself; otherwise Fabric on one device
(``memclaims.measure.runner``).
The real engines run through ``memclaims.measure.pipeline``; the sim replays the same training loop
(``memclaims.measure.loop``) on fake tensors; every engine's Record is assembled by
``memclaims.measure.record_builder``. A sharded run returns one Record per rank, rank 0 first.
What the sim alone takes (an allocator limit, the allocator's history, the load-only replay of the 07
scripts) is asked for in ``RunOptions`` too; a real device refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.recipes import requirements
from memclaims.recipes.run_options import SIM_ONLY, RunOptions

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe
    from memclaims.sim.allocator import TraceEvent


class Measurement(list[Record]):
    """What ``run_recipe`` returns: the run's Records (one, or one per rank, rank 0 first), and beside
    them what a caller asked for that is no part of a Record.

    A list, so that every caller reads the Records as before (``run_recipe(...)[0]``); the extras are
    attributes of the list, not fields of a Record, so a Record's keys (baseline files store them)
    never change with what its caller asked for: ``allocator_events``, the allocator model's
    history (``RunOptions.allocator_events``; None where not asked for)."""

    def __init__(self, records: Iterable[Record], allocator_events: list[TraceEvent] | None = None) -> None:
        super().__init__(records)
        self.allocator_events = allocator_events


def runs_ranks(recipe: Recipe, options: RunOptions) -> bool:
    """Whether ``run_recipe`` starts several processes (one Record each) for this recipe."""
    return options.device != "sim" and (recipe.distributed is not None or (options.devices or 1) > 1)


def run_recipe(recipe: Recipe, options: RunOptions) -> Measurement:
    if options.device == "sim":
        return _simulate(recipe, options)
    for hooks in recipe.hooks:  # a technique the device cannot run (expandable-segments on the CPU)
        refused = hooks.refusal(recipe, options)
        if refused:
            raise UsageError(refused)
    asked = [name for name, default in SIM_ONLY.items() if getattr(options, name) != default]
    if asked:
        raise UsageError(f"{', '.join(asked)}: the sim's options (--device sim); {options.device} measures a real run")
    if runs_ranks(recipe, options):
        from memclaims.measure import distributed

        return Measurement(distributed.run_distributed(recipe, options, timeout_s=options.timeout_s).records)
    from memclaims.measure import runner

    stack = recipe.stack_hooks
    if stack is not None:  # a stack that runs the loop itself: its driver (memclaims.measure.stacks) as the engine
        from memclaims.measure.stacks import driver_class

        return Measurement([runner.run(recipe, options, engine=driver_class(stack))])
    return Measurement([runner.run(recipe, options)])


def _simulate(recipe: Recipe, options: RunOptions) -> Measurement:
    from memclaims.sim.replays import simulate, simulate_load_record

    events: list[TraceEvent] | None = [] if options.allocator_events else None
    if options.load_only:
        record = simulate_load_record(recipe, profile=options.profile, allocator_events=events,
                                      limit_bytes=options.limit_bytes)
    else:
        record = simulate(recipe, profile=options.profile, memory_steps=options.memory_steps,
                          allocator_events=events, limit_bytes=options.limit_bytes, devices=options.devices)
    return Measurement([record], allocator_events=events)


def run_recipes(recipes: Sequence[Recipe], options: RunOptions) -> list[list[Record]]:
    """``run_recipe`` of each recipe, those on ranks in one process group (starting ranks costs seconds)."""
    ranked = [r for r in recipes if runs_ranks(r, options)]
    groups = {}
    if ranked:
        from memclaims.measure import distributed

        results = distributed.run_distributed_many(ranked, options, timeout_s=options.timeout_s)
        groups = {recipe.id: result.records for recipe, result in zip(ranked, results)}
    return [groups[r.id] if r.id in groups else run_recipe(r, options) for r in recipes]


def refuse(recipe: Recipe, options: RunOptions) -> None:
    """Raise UsageError, with the reason, for a recipe the options' engine cannot run at all (today
    only the sim refuses recipes before running them: those it has no replay of)."""
    if options.device == "sim":
        from memclaims.sim.replays import check as sim_check

        sim_check(recipe)


@lru_cache(maxsize=8)
def model_parameters(workload: str, scale: str) -> tuple[Any, ...]:
    """The workload's model at ``scale`` as it builds it, on the meta device: the parameters' shapes
    and dtypes, no memory, no data (the course's claims are arithmetic on them)."""
    import torch

    from memclaims.workloads.registry import workload as find_workload

    work = find_workload(workload)
    with torch.device("meta"):
        model, _ = work.build_model(work.scale(scale))
    return tuple(model.parameters())


# --- what each engine needs --------------------------------------------------------------------

def needs(recipe: Recipe, tier: str) -> requirements.Needs:
    """A resolved recipe's needs on ``tier``: its techniques', the packages its workload builds on
    (torchvision for ViT, transformers for text; on every tier, the sim builds the same model), and
    on the sim, why it cannot be replayed (if it cannot)."""
    from memclaims.core.names import workload_packages
    from memclaims.sim.replays import check as sim_check

    result = requirements.for_techniques(recipe.techniques, tier) | requirements.Needs(
        packages=frozenset(workload_packages(recipe.workload.name)))
    if tier != "sim":  # what a technique refuses before running on the device (a stack's workload, what it expresses)
        from memclaims.core.names import tier_device

        options = RunOptions(device="cuda" if result.cuda_devices else tier_device(tier))
        refused = (hooks.refusal(recipe, options) for hooks in recipe.hooks)
        result |= requirements.Needs(unsupported=tuple(reason for reason in refused if reason))
    if tier == "sim":
        try:
            sim_check(recipe)
        except UsageError as error:  # e.g. a sharded recipe with an 8-bit optimizer
            result |= requirements.Needs(unsupported=(str(error),))
    return result


def case_needs(recipe: Recipe, tier: str) -> requirements.Needs:
    """A technique-matrix case's needs: its recipe's, and on the cpu tier nothing for 16-mixed to
    measure (Lightning would run bf16-mixed under the 16-mixed id)."""
    result = needs(recipe, tier)
    if tier == "cpu" and recipe.precision == "16-mixed":
        result |= requirements.Needs(unsupported=(requirements.FP16_MIXED_ON_CPU,))
    return result
