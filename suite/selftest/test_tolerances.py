"""Where the accuracy tolerances come from (memclaims.spread) and the version matrix's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memclaims import matrix, spread
from memclaims.baselines import BaselineStore
from memclaims.record import Record

ROOT = Path(__file__).resolve().parents[2]


def test_same_class_is_the_floor_and_across_classes_the_measured_spread() -> None:
    fp32 = spread.Spread("r", "32-true", 0.60, {"default": 0.56, "avx512": 0.61}, {"123": 0.60, "1": 0.40})
    assert fp32.tolerance == spread.FLOOR  # a class's runs are deterministic
    assert fp32.cross_class_tolerance == pytest.approx(spread.CLASS_FACTOR * 0.04)  # seeds not absorbed
    still = spread.Spread("r", "32-true", 0.60, {"default": 0.60}, {"123": 0.60, "1": 0.50})
    assert still.cross_class_tolerance == pytest.approx(spread.FLOOR)
    half = spread.Spread("r", "bf16-true", 0.60, {"default": 0.60}, {"123": 0.60, "1": 0.50, "2": 0.70})
    assert half.cross_class_tolerance == pytest.approx(round(spread.SEED_FACTOR * 0.1, 4))  # as a reseed


def test_committed_tolerances_cover_every_cpu_case_and_say_how_they_were_obtained() -> None:
    store = BaselineStore(ROOT / "baselines")
    accuracy = store.tolerances()["accuracy"]
    assert "ATEN_CPU_CAPABILITY" in accuracy["how"]
    for recipe_id in spread.cpu_recipes():
        tolerance = store.accuracy_tolerance(recipe_id)
        assert tolerance is not None, f"{recipe_id} has no measured accuracy tolerance in tolerances.json"
        across = store.accuracy_tolerance(recipe_id, across_classes=True)
        entry = accuracy["recipes"][recipe_id]
        assert across is not None and across >= tolerance >= spread.FLOOR and entry["by_class"] and entry["by_seed"]


def test_matrix_report_names_what_moved_under_which_library(tmp_path: Path) -> None:
    moved = {"case": "cpu:vit-smoke/fabric", "metric": "peak_allocated_bytes", "baseline": 1048576,
             "now": 2097152, "verdict": "regression",
             "environment_change": "lightning 2.6.6 -> 2.5.6, torch unchanged"}
    still = dict(moved, case="cpu:vit-smoke/sgd", verdict="ok", now=1048576)
    (tmp_path / "torch2.14.1-lightning2.5.6.json").write_text(json.dumps({"rows": [moved, still]}))
    (tmp_path / "torch2.14.1-lightning2.6.6.json").write_text(json.dumps({"rows": [still]}))
    (tmp_path / "torch2.13.0-lightning2.6.6.json").write_text(json.dumps(
        {"rows": [], "error": "ERROR: memclaims: the installed packages cannot run the suite: torchvision 0.28.0"}))
    lines = matrix.report(tmp_path)
    assert any("lightning2.5.6" in line and "cpu:vit-smoke/fabric" in line and "regression" in line
               and "(lightning 2.6.6 -> 2.5.6)" in line for line in lines)
    assert any("lightning2.6.6" in line and "none moved beyond tolerance" in line for line in lines)
    assert any("torch2.13.0" in line and "ran no case: ERROR: memclaims: the installed packages" in line
               for line in lines)
    assert not any("cpu:vit-smoke/sgd" in line for line in lines)


def test_loss_trajectory_moves_are_caught_both_ways_and_class_noise_is_not() -> None:
    from memclaims.compare import LOSSES, OK, REGRESSION, compare_losses, default_tolerances

    base = [2.3026, 2.3046, 2.2992, 2.2990]
    other_class = [2.3026, 2.3047, 2.2992, 2.2989]  # measured: avx2 vs ATen's default kernels, bf16-mixed
    tolerance = default_tolerances("cpu")[LOSSES]
    assert compare_losses(base, other_class, tolerance).verdict == OK
    lr_x10 = [2.3026, 2.3474, 2.3082, 2.3169]  # measured: the same recipe with Adam's lr x 10
    moved = compare_losses(base, lr_x10, tolerance)
    assert (moved.metric, moved.verdict, moved.detail) == (LOSSES, REGRESSION, "step 1")
    assert moved.change_pct == pytest.approx((2.3474 - 2.3046) / 2.3046 * 100)
    lower = compare_losses(base, [x * 0.99 for x in base], tolerance)  # a lower loss is a change too
    assert lower.verdict == REGRESSION
    diverged = compare_losses(base, [2.3026, None, None, None], tolerance)
    assert diverged.verdict == REGRESSION and diverged.detail == "step 1: diverged"


def _smoke_record(technique: str, lr_factor: float = 1.0, break_accumulation: bool = False) -> Record:
    import dataclasses

    from memclaims.options import RunOptions
    from memclaims.recipe import resolve
    from memclaims.runner import run

    recipe = resolve("vit", "smoke", (technique,))
    scale = dataclasses.replace(recipe.scale, learning_rate=recipe.scale.learning_rate * lr_factor)
    recipe = dataclasses.replace(recipe, scale=scale)
    if break_accumulation:  # a step on every micro-batch, with the loss still divided by the count
        from memclaims import loop

        original = loop.TrainingLoop.train

        def every_micro_batch(self, model, optimizer, scheduler, batches, steps, on_step=None, **phases):  # type: ignore[no-untyped-def]
            self.accumulation_steps, count = 1, self.accumulation_steps
            scaled = ((inputs, targets) for inputs, targets in batches)
            forward = self.forward_loss
            self.forward_loss = lambda m, i, t: forward(m, i, t) / count  # type: ignore[method-assign]
            return original(self, model, optimizer, scheduler, scaled, steps, on_step, **phases)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(loop.TrainingLoop, "train", every_micro_batch)
            return run(recipe, RunOptions(device="cpu", evaluate=False, memory_steps=3))
    return run(recipe, RunOptions(device="cpu", evaluate=False, memory_steps=3))


@pytest.mark.cpu
@pytest.mark.parametrize("fault", ["lr x10", "lr /10", "broken accumulation"])
def test_training_faults_that_accuracy_misses_at_smoke_scale_fail_the_baseline(fault: str) -> None:
    """At smoke scale Adam's lr x 10 costs the fp32 reference 3.3 points and broken accumulation
    2.5 points (measured), inside cross-class accuracy tolerances: the loss trajectory catches both."""
    from memclaims.compare import compare

    technique = "grad-accum" if fault == "broken accumulation" else "fabric"
    clean = _smoke_record(technique)
    faulty = (_smoke_record(technique, break_accumulation=True) if fault == "broken accumulation" else
              _smoke_record(technique, lr_factor=10.0 if fault == "lr x10" else 0.1))
    result = compare(faulty, clean, case_id=f"cpu:{clean.recipe}")
    # Broken accumulation also moves phases.zero_grad.* (zero_grad now runs after the forward pass,
    # with the activations alive): per-phase peaks catch it too.
    assert "memory_losses" in [r.metric for r in result.failures], result.message()
    assert f"cpu:{clean.recipe}: memory_losses (step " in result.message()
    assert not compare(_smoke_record(technique), clean).failures  # the control: a rerun is identical
