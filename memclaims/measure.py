"""``measure(recipe, options) -> list[Record]``: how every caller runs a recipe.

It picks the engine and nothing else: the simulated GPU (``memclaims.sim``) for ``--device sim``;
the sharded ranks (``memclaims.distributed``: FSDP2 on CPU ranks, Lightning FSDP on CUDA ranks)
for a sharded recipe or several devices; otherwise Fabric on one device (``memclaims.runner``).
The real engines run through ``memclaims.pipeline``; the sim replays the same training loop
(``memclaims.loop``) on fake tensors. A sharded run returns one Record per rank, rank 0 first.
"""

from __future__ import annotations

from collections.abc import Sequence

from memclaims.options import RunOptions
from memclaims.recipe import Recipe
from memclaims.record import Record


def runs_ranks(recipe: Recipe, options: RunOptions) -> bool:
    """Whether ``measure`` starts several processes (one Record each) for this recipe."""
    return options.device != "sim" and (recipe.sharded or (options.devices or 1) > 1)


def measure(recipe: Recipe, options: RunOptions) -> list[Record]:
    if options.device == "sim":
        from memclaims import sim

        return [sim.simulate(recipe, profile=options.profile, memory_steps=options.memory_steps)]
    if runs_ranks(recipe, options):
        from memclaims import distributed

        return distributed.run_distributed(recipe, options, timeout_s=options.timeout_s).records
    from memclaims import runner

    return [runner.run(recipe, options)]


def measure_many(recipes: Sequence[Recipe], options: RunOptions) -> list[list[Record]]:
    """``measure`` of each recipe, those on ranks in one process group (starting ranks costs seconds)."""
    ranked = [r for r in recipes if runs_ranks(r, options)]
    groups = {}
    if ranked:
        from memclaims import distributed

        results = distributed.run_distributed_many(ranked, options, timeout_s=options.timeout_s)
        groups = {recipe.id: result.records for recipe, result in zip(ranked, results)}
    return [groups[r.id] if r.id in groups else measure(r, options) for r in recipes]
