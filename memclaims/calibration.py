"""``memclaims baselines calibrate`` for a sharded recipe: its ranks launched here, one baseline per rank.

Each rank's numbers depend on the world size and the rank (``Record.baseline_key``:
``vit-smoke/fsdp@2/rank1``), so each gets tolerances from its own spread over the runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from memclaims.baselines import Baseline, BaselineStore, environment_id, overrides
from memclaims.compare import ACCURACY, MEMORY_METRICS, default_tolerances
from memclaims.options import RunOptions
from memclaims.recipe import Recipe, parse_id
from memclaims.record import Record

# (recipe, device, devices, timeout) -> one Record per rank
RanksFn = Callable[[Recipe, str, "int | None", "float | None"], Sequence[Record]]


def _launch(recipe: Recipe, device: str, devices: int | None, timeout_s: float | None) -> Sequence[Record]:
    from memclaims.measure import measure

    return measure(recipe, RunOptions(device=device, evaluate=False, devices=devices, timeout_s=timeout_s))


def spread_tolerances(records: Sequence[Record], factor: float = 3.0) -> dict[str, float | None]:
    """max(the tier's floor, factor x relative spread) per memory metric and for accuracy."""
    floors = default_tolerances(records[0].device)
    tolerances: dict[str, float | None] = dict(floors)
    for metric in MEMORY_METRICS:
        values = [getattr(r, metric) for r in records if getattr(r, metric) is not None]
        if values and statistics.mean(values) > 0:
            spread = (max(values) - min(values)) / statistics.mean(values)
            tolerances[metric] = max(floors[metric] or 0.0, factor * spread)
    accuracies = [r.accuracy for r in records if r.accuracy is not None]
    if accuracies:
        tolerances[ACCURACY] = max(floors[ACCURACY] or 0.0, factor * (max(accuracies) - min(accuracies)))
    return tolerances


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
