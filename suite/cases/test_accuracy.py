"""Accuracy where it means something: the ViT trained to its plateau (the ``converged`` scale).

Short of a plateau (the smoke cases: one epoch) another torch release or CPU class moves accuracy by
points, so there it is reported, not asserted. Here a numerics change moves it by tenths of a point
and a training fault (learning rate 10x off, broken accumulation, an update 100x too small) by
points: each case is compared with its baseline, with the noise measured for a library or CPU-class
change (memclaims.baselines.noise) and, past it, a rerun with the stored extra seeds before it fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from memclaims import run
from memclaims.claims import accuracy
from memclaims.core.names import CONVERGED
from memclaims.measure import active
from memclaims.pytest.baselines import BaselineCheck
from memclaims.pytest.records import CPU_CONVERGED_GROUP, RecordCache
from memclaims.recipes.recipe import resolve

# Far below any converged recipe (96-98 % on the digits) and far above chance (10 %): a recipe
# under it did not train, whatever its baseline says.
CONVERGED_FLOOR = 0.90


def _params() -> list[Any]:
    params = []
    for tier in ("cpu", "gpu"):
        for techniques in accuracy.CONVERGED_CASES:
            recipe = resolve("vit", CONVERGED, techniques)
            marks = [getattr(pytest.mark, tier), pytest.mark.requires(run.case_needs(recipe, tier))]
            if tier == "cpu":  # with test_claims.py's accuracy claims, which read the same Records
                marks.append(pytest.mark.xdist_group(CPU_CONVERGED_GROUP))
            params.append(pytest.param(tier, techniques, id=f"{tier}:{recipe.id}", marks=marks))
    return params


# Not named (tier, techniques): the plugin parametrizes those with the technique matrix.
@pytest.mark.parametrize(("tier", "converged"), _params())
def test_converged_accuracy(tier: str, converged: tuple[str, ...], record_cache: RecordCache,
                            baseline_check: BaselineCheck, request: pytest.FixtureRequest,
                            record_property: Any) -> None:
    recipe = record_cache.recipe(tier, "vit", converged, scale=CONVERGED)
    record = record_cache.get(tier, recipe)
    assert record.accuracy_schedule.get("plateau"), f"{recipe.id} did not keep its schedule: {record.accuracy_schedule}"
    assert record.accuracy is not None and record.accuracy >= CONVERGED_FLOOR, (
        f"{recipe.id}: accuracy {record.accuracy} after {record.accuracy_schedule.get('epochs')} epochs is under "
        f"{CONVERGED_FLOOR:.0%}: the recipe did not train to its plateau")
    inactive = active.problems(recipe, record)
    assert not inactive, "\n".join(inactive)
    baseline_check.check(request.node.callspec.id, record, record_property,
                         rerun=lambda seed: record_cache.accuracy_at(tier, recipe, seed))
