"""``memclaims baselines calibrate`` for a sharded recipe: its ranks launched here, one baseline per rank.

Each rank's numbers depend on the world size and the rank (``Record.baseline_key``:
``vit-smoke/fsdp@2/rank1``), so each gets tolerances from its own spread over the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memclaims.baselines.compare import spread_tolerances
from memclaims.baselines.store import Baseline, BaselineStore, overrides
from memclaims.core.environment import environment_id
from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, parse_id
from memclaims.recipes.run_options import RunOptions

# (recipe, device, devices, timeout) -> one Record per rank
RanksFn = Callable[[Recipe, str, "int | None", "float | None"], Sequence[Record]]


def _launch(recipe: Recipe, device: str, devices: int | None, timeout_s: float | None) -> Sequence[Record]:
    from memclaims.run import run_recipe

    return run_recipe(recipe, RunOptions(device=device, evaluate=False, devices=devices, timeout_s=timeout_s))


def calibrate_ranks(recipe_id: str, runs: int, store: BaselineStore, *, device: str = "cpu",
                    devices: int | None = None, timeout_s: float | None = None,
                    ranks_fn: RanksFn | None = None) -> dict[str, dict[str, float | None]]:
    """Run a sharded recipe ``runs`` times; store each rank's baseline with its own tolerances."""
    recipe = parse_id(recipe_id)
    launch = ranks_fn or _launch
    runs_by_rank: dict[int, list[Record]] = {}
    for _ in range(runs):
        for record in launch(recipe, device, devices, timeout_s):
            runs_by_rank.setdefault(record.rank, []).append(record)
    environment = environment_id(runs_by_rank[0][0])
    existing = store.load(environment, fresh=True)
    updates: dict[str, Baseline] = {}
    result: dict[str, dict[str, float | None]] = {}
    for records in runs_by_rank.values():
        key = records[0].baseline_key
        tolerances = spread_tolerances(records)
        kept = existing.get(key)
        record = kept.record if kept else records[0]
        updates[key] = Baseline(record=record, tolerances=overrides(record, tolerances))
        result[key] = tolerances
    store.update(environment, updates)
    return result
