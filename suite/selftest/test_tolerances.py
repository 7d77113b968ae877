"""Where the accuracy tolerances come from (memclaims.spread) and the version matrix's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memclaims import matrix, spread
from memclaims.baselines import BaselineStore

ROOT = Path(__file__).resolve().parents[2]


def test_tolerance_is_the_widest_of_class_deviation_seed_spread_and_floor() -> None:
    by_class = spread.Spread("r", 0.60, {"default": 0.57, "avx512": 0.61}, {"123": 0.60, "1": 0.60})
    assert by_class.tolerance == pytest.approx(0.03)  # the class deviation wins
    by_seed = spread.Spread("r", 0.60, {"default": 0.60}, {"123": 0.60, "1": 0.50, "2": 0.70})
    assert by_seed.tolerance == pytest.approx(round(spread.SEED_FACTOR * 0.1, 4))
    still = spread.Spread("r", 0.60, {"default": 0.60}, {"123": 0.60})
    assert still.tolerance == pytest.approx(round(spread.FLOOR, 4))  # two test images, never zero


def test_committed_tolerances_cover_every_cpu_case_and_say_how_they_were_obtained() -> None:
    store = BaselineStore(ROOT / "baselines")
    accuracy = store.tolerances()["accuracy"]
    assert "ATEN_CPU_CAPABILITY" in accuracy["how"]
    for recipe_id in spread.cpu_recipes():
        tolerance = store.accuracy_tolerance(recipe_id)
        assert tolerance is not None, f"{recipe_id} has no measured accuracy tolerance in tolerances.json"
        entry = accuracy["recipes"][recipe_id]
        assert tolerance >= spread.FLOOR - 1e-9 and entry["by_class"] and entry["by_seed"]


def test_matrix_report_names_what_moved_under_which_library(tmp_path: Path) -> None:
    moved = {"case": "cpu:vit-smoke/fabric", "metric": "peak_allocated_bytes", "baseline": 1048576,
             "now": 2097152, "verdict": "regression",
             "environment_change": "lightning 2.6.6 -> 2.5.6, torch unchanged"}
    still = dict(moved, case="cpu:vit-smoke/sgd", verdict="ok", now=1048576)
    (tmp_path / "torch2.14.1-lightning2.5.6.json").write_text(json.dumps({"rows": [moved, still]}))
    (tmp_path / "torch2.14.1-lightning2.6.6.json").write_text(json.dumps({"rows": [still]}))
    (tmp_path / "torch2.13.0-lightning2.6.6.json").write_text(json.dumps({"rows": []}))
    lines = matrix.report(tmp_path)
    assert any("lightning2.5.6" in line and "cpu:vit-smoke/fabric" in line and "regression" in line
               and "(lightning 2.6.6 -> 2.5.6)" in line for line in lines)
    assert any("lightning2.6.6" in line and "none moved beyond tolerance" in line for line in lines)
    assert any("torch2.13.0" in line and "ran no case" in line for line in lines)
    assert not any("cpu:vit-smoke/sgd" in line for line in lines)
