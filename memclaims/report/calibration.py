"""``memclaims baselines calibrate``: tolerances from the spread of repeated runs, with a floor, stored with the
baseline (``calibrate``); for a sharded recipe its ranks launched here, one baseline per rank (``calibrate_ranks``):
each rank's numbers depend on the world size and the rank (``Record.baseline_key``: ``vit-smoke/fsdp@2/rank1``), so
each gets tolerances from its own spread over the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memclaims.baselines.compare import spread_tolerances
from memclaims.baselines.store import Baseline, BaselineStore, overrides
from memclaims.core.environment import environment_id
from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, parse_id
from memclaims.recipes.run_options import RunOptions

RunFn = Callable[[Recipe, str, bool], Record]  # (recipe, device, evaluate) -> Record
# (recipe, device, devices, timeout) -> one Record per rank
RanksFn = Callable[[Recipe, str, "int | None", "float | None"], Sequence[Record]]


def run_once(recipe: Recipe, device: str, evaluate: bool) -> Record:
    """One run of a one-device recipe through the one door (``memclaims.run``)."""
    from memclaims.run import run_recipe

    return run_recipe(recipe, RunOptions(device=device, evaluate=evaluate))[0]


def calibrate(recipe_id: str, runs: int, store: BaselineStore, *, device: str = "cpu",
              run_fn: RunFn | None = None, factor: float = 3.0) -> dict[str, float | None]:
    """Run a recipe ``runs`` times; tolerance = max(floor, factor x relative spread), stored with its baseline.

    The floor is the tier's default tolerance: a deterministic tier must not get a zero tolerance.
    """
    run_fn = run_fn or run_once
    recipe = parse_id(recipe_id)
    records = [run_fn(recipe, device, True) for _ in range(runs)]
    tolerances = spread_tolerances(records, factor)
    environment = environment_id(records[0])
    existing = store.load(environment, fresh=True).get(recipe.id)
    record = existing.record if existing else records[0]
    store.update(environment, {recipe.id: Baseline(record=record, tolerances=overrides(record, tolerances))})
    return tolerances


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
