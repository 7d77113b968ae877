"""memclaims.baselines.noise and memclaims.report.spread on constructed Records: which tolerance applies when, the
seeds deciding an accuracy one run cannot judge, and tolerances drawn from measured changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.baselines.compare import ACCURACY, LOSSES, OK, REGRESSION
from memclaims.baselines.noise import AccuracyNoise, Noise, changed, judge
from memclaims.core.record import Record
from memclaims.pytest.testing import FAKE_VERSIONS, PLATEAU, fake_record
from memclaims.report import spread

RECIPE = "vit-converged/fabric"
ENV = "cpu-x86_64"
# Measured-like: 5 seeds with a standard deviation of 0.37 points, 1 point after a change.
NOISE = Noise(accuracy={RECIPE: AccuracyNoise(RECIPE, same=0.005, change=0.01,
                                              by_seed={"123": 0.96, "1": 0.965, "2": 0.955, "3": 0.962, "4": 0.958})},
              loss_per_step=[0.0001, 0.001, 0.003])
UPGRADED = {**FAKE_VERSIONS, "torch": "2.15.0"}


def converged(accuracy: float, **changes: object) -> Record:
    return fake_record(RECIPE, accuracy=accuracy, accuracy_schedule=PLATEAU, **changes)


def _accuracy(record: Record, rerun: object = None) -> tuple[str, str, float | None]:
    comparison = judge(record, converged(0.96), ENV, NOISE, rerun=rerun)  # type: ignore[arg-type]
    result = next(r for r in comparison.results if r.metric == ACCURACY)
    return result.verdict, result.detail, result.tolerance


def test_the_same_stack_gets_the_same_tolerance_and_a_change_the_measured_one() -> None:
    assert _accuracy(converged(0.957))[0] == OK  # 0.3 points: inside the same-stack 0.5
    verdict, detail, tolerance = _accuracy(converged(0.952, versions=UPGRADED))
    assert (verdict, tolerance) == (OK, 0.01)  # 0.8 points after torch changed: inside the change noise
    assert "after a change (torch 2.14.1 -> 2.15.0)" in detail and "1.00 points" in detail


def test_past_its_tolerance_the_seeds_decide_and_the_message_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def reseed_like(seed: int) -> float:  # the change acted as a reseed: the mean did not move
        asked.append(seed)
        return {1: 0.968, 2: 0.952, 3: 0.965, 4: 0.955}[seed]

    verdict, detail, allowed = _accuracy(converged(0.945, versions=UPGRADED), reseed_like)
    assert asked == [1, 2, 3, 4] and verdict == OK
    assert "reran with 4 more seeds (1, 2, 3, 4): mean over 5 seeds" in detail
    assert allowed == pytest.approx(3 * NOISE.accuracy[RECIPE].seed_sd * (2 / 5) ** 0.5)

    def faulty(seed: int) -> float:  # a real fault: every seed lost points
        return NOISE.accuracy[RECIPE].by_seed[str(seed)] - 0.06

    verdict, detail, _ = _accuracy(converged(0.90, versions=UPGRADED), faulty)
    assert verdict == REGRESSION and "drop 6.00 points" in detail and "seed standard deviation" in detail


def test_without_seeds_to_rerun_a_drop_past_the_tolerance_fails() -> None:
    verdict, detail, _ = _accuracy(converged(0.94, versions=UPGRADED))
    assert verdict == REGRESSION and "no extra seeds to rerun with" in detail


def test_a_loss_trajectory_gets_per_step_tolerances_only_after_a_change() -> None:
    base = fake_record(RECIPE, memory_losses=[2.0, 2.0, 2.0])
    drifted = [2.0, 2.001, 2.005]  # 0.05 % at step 1, 0.25 % at step 2
    same = judge(fake_record(RECIPE, memory_losses=drifted), base, ENV, NOISE)
    assert next(r for r in same.results if r.metric == LOSSES).verdict == REGRESSION  # the tier's 0.1 %
    upgraded = judge(fake_record(RECIPE, memory_losses=drifted, versions=UPGRADED), base, ENV, NOISE)
    assert next(r for r in upgraded.results if r.metric == LOSSES).verdict == OK


def test_changed_names_the_class_and_each_library() -> None:
    base = fake_record()
    assert changed(base, fake_record(), ENV, ENV) == ""
    assert changed(base, fake_record(versions={**FAKE_VERSIONS, "python": "3.13.0"}), ENV, ENV) == ""
    moved = changed(base, fake_record(versions=UPGRADED), "cpu-x86_64-avx2-cu130", "cpu-x86_64-avx512-cu130")
    assert moved == "cpu-x86_64-avx2-cu130 -> cpu-x86_64-avx512-cu130, torch 2.14.1 -> 2.15.0"


def test_tolerances_are_drawn_from_what_was_measured(tmp_path: Path) -> None:
    """spread.changes reads a worker's Records against the baselines; spread.document draws the
    tolerances: the largest change x the margin, at least the floor, per recipe and per loss step."""
    baseline = converged(0.96, memory_losses=[2.0, 2.0, 2.0])
    smoke = fake_record("vit-smoke/fabric", memory_losses=[2.0, 2.0, 2.0])
    lines = [{"tier": "converged", "recipe": RECIPE, "record": converged(0.95, versions=UPGRADED).to_dict()},
             {"tier": "cpu", "recipe": "vit-smoke/fabric",
              "record": fake_record("vit-smoke/fabric", memory_losses=[2.0, 2.002, 1.99], versions=UPGRADED).to_dict()},
             {"tier": "cpu", "recipe": "vit-smoke/fabric", "record": smoke.to_dict()},  # the baseline's own stack
             {"tier": "cpu", "recipe": "vit-smoke/sgd", "skipped": "why"}]
    path = tmp_path / "torch2.15.0.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    accuracy, losses = spread.changes([path], {RECIPE: baseline, "vit-smoke/fabric": smoke})
    assert accuracy == {RECIPE: {"torch 2.15.0": 0.95}}
    assert losses == {"torch 2.15.0": [0.0, pytest.approx(0.001), pytest.approx(0.005)]}
    seeds = {f"vit-converged/{'+'.join(t)}": {"123": 0.96, "1": 0.97} for t in spread_recipes()}
    data = spread.document(seeds, {"lr-div10": {"fabric": 0.80}}, accuracy, losses, {}, {}, 1.0)
    entry = data["accuracy"]["recipes"][RECIPE]
    assert entry["same"] == spread.SAME_FLOOR and entry["change"] == 0.015  # 1.5 x 1 point
    assert data["losses"]["per_step"] == [spread.LOSS_FLOOR, 0.002, 0.01]
    fabric = data["claims"]["claims"]["fabric-accuracy"]
    assert fabric["mutation_drops"] == {"lr-div10": 0.16} and fabric["mutations_caught"] == ["lr-div10"]
    assert Noise.from_json(data).accuracy[RECIPE].change == 0.015


def spread_recipes() -> list[tuple[str, ...]]:
    from memclaims.claims.accuracy import CONVERGED_CASES

    return list(CONVERGED_CASES)


def test_the_committed_noise_covers_every_converged_case_and_says_how() -> None:
    from memclaims.baselines.store import BaselineStore
    from memclaims.claims.accuracy import CONVERGED_CASES

    store = BaselineStore(ROOT / "baselines")
    noise = store.noise()
    for techniques in CONVERGED_CASES:
        entry = noise.accuracy[f"vit-converged/{'+'.join(techniques)}"]
        assert entry.same <= entry.change and len(entry.by_seed) >= 5 and entry.by_change, entry
    assert noise.loss_per_step and all(t >= spread.LOSS_FLOOR for t in noise.loss_per_step)
    data = store.tolerances()
    # Measured across another CPU class and real releases, and it says so.
    assert "ATen CPU class" in data["accuracy"]["how"]
    assert any(c.startswith("class ") for c in data["changes"]), data["changes"]
    assert any(c.startswith("torch ") for c in data["changes"]), data["changes"]
