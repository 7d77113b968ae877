"""``memclaims baselines calibrate`` on one device, on constructed runs (no training); on ranks:
suite/unit/measure/test_launcher_slurm.py."""

from __future__ import annotations

import itertools
from pathlib import Path

from memclaims.baselines.store import BaselineStore
from memclaims.core.record import Record
from memclaims.pytest.testing import FAKE_PEAK as PEAK
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import Recipe
from memclaims.report.calibration import calibrate


def test_calibrate_stores_spread_with_a_floor(tmp_path: Path) -> None:
    peaks = itertools.cycle([PEAK, int(PEAK * 1.02), PEAK])

    def noisy(recipe: Recipe, device: str, evaluate: bool) -> Record:
        return fake_record(recipe.id, peak_allocated_bytes=next(peaks))

    store = BaselineStore(tmp_path)
    tolerances = calibrate("vit-smoke/bf16-true", 3, store, run_fn=noisy)
    assert abs((tolerances["peak_allocated_bytes"] or 0) - 3 * 0.02 / (1.02 / 3 + 2 / 3)) < 1e-3
    assert tolerances["param_bytes"] == 0.005  # no spread: the floor
    stored = store.load("cpu-x86_64", fresh=True)["vit-smoke/bf16-true"]
    # Only what differs from the defaults is stored: the one metric that spread.
    assert stored.tolerances == {"peak_allocated_bytes": tolerances["peak_allocated_bytes"]}
