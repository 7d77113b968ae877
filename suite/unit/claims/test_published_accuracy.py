"""The published-accuracy check (suite/cases/test_published_accuracy.py) on constructed Records and faked
data and weights: what a session needs, and both verdicts. Numbers come from published.json."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from memclaims.claims import published_accuracy
from memclaims.claims.published_accuracy import Facts, Target, judge, unmet
from memclaims.core.record import Record
from memclaims.measure.runner import RunOptions
from memclaims.pytest.testing import fake_record

TARGETS = {t.name: t for t in published_accuracy.targets()}
BF16 = TARGETS["vit_chain/03_bfloat16"]
DISTILBERT = TARGETS["llm_bonus/bonus_distilbert-after"]


def facts(*, gpus: int = 1, scale: str = "article", data: bool = True, weights: bool = True,
          full_epochs: bool = True) -> Facts:
    return Facts(cuda_devices=gpus, gpu_scale=scale,
                 options=RunOptions(device="cuda", data_dir="/data", accuracy_full_epochs=full_epochs),
                 data_available=lambda kind, where: data and where == "/data", weights_cached=lambda work: weights)


def run_of(target: Target, pct: float, **changes: object) -> Record:
    recipe = target.recipe()
    values: dict[str, object] = dict(
        scale="article", workload=target.workload, techniques=list(target.techniques), device="cuda",
        data=target.needs.data, weights="pretrained", accuracy=pct / 100, devices=target.needs.cuda_devices,
        accuracy_schedule={"kind": "epochs", "epochs": recipe.scale.accuracy_epochs, "optimizer_steps": None,
                           "test_examples": 10_000})
    values.update(changes)
    return fake_record(recipe.id, **values)


def test_targets_are_the_logged_runs_on_the_articles_data() -> None:
    from memclaims.core import published

    chain = [r["script"] for r in published.data()["vit_chain"] if r.get("accuracy_pct") is not None]
    assert list(TARGETS) == [f"vit_chain/{s}" for s in chain] + ["llm_bonus/bonus_distilbert-after"]
    assert {t.needs.data for t in TARGETS.values()} == {"cifar10", "imdb"}
    assert BF16.published_pct == published.row("vit_chain", "03_bfloat16")["accuracy_pct"]
    assert DISTILBERT.needs.cuda_devices == 4 and DISTILBERT.recipe().distributed
    logged = [r["accuracy_pct"] for r in published.data()["vit_chain"] if r.get("accuracy_pct") is not None]
    assert published_accuracy.chain_spread() == max(logged) - min(logged)  # the band: the chain's own spread


def test_a_session_with_everything_compares() -> None:
    assert unmet(BF16, facts()) is None
    assert unmet(DISTILBERT, facts(gpus=4, full_epochs=False)) is None  # text has no budgeted schedule


def test_each_missing_need_skips_with_how_to_get_it() -> None:
    assert "needs a CUDA GPU" in (unmet(BF16, facts(gpus=0)) or "")
    assert "needs 4 CUDA devices, as the published run (1 here" in (unmet(DISTILBERT, facts(gpus=1)) or "")
    assert "--memclaims-gpu-scale article" in (unmet(BF16, facts(scale="smoke")) or "")
    no_data = unmet(BF16, facts(data=False)) or ""
    assert "CIFAR-10" in no_data and "--memclaims-download" in no_data and "--memclaims-data-dir" in no_data
    assert "IMDb" in (unmet(DISTILBERT, facts(gpus=4, data=False)) or "")
    assert "torch hub cache" in (unmet(BF16, facts(weights=False)) or "")
    assert "huggingface-cli download distilbert-base-uncased" in (unmet(DISTILBERT, facts(gpus=4, weights=False)) or "")
    budget = unmet(BF16, facts(full_epochs=False)) or ""
    assert "--memclaims-accuracy-full-epochs" in budget and "optimizer steps" in budget, budget


def test_data_available_finds_the_folders_download_writes(tmp_path: Path) -> None:
    from memclaims.claims.published_accuracy import data_available

    assert not data_available("cifar10", tmp_path) and not data_available("imdb", tmp_path)
    assert not data_available("cifar10", tmp_path / "absent") and not data_available("cifar10", None)
    (tmp_path / "images" / "cifar-10-batches-py").mkdir(parents=True)
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            (tmp_path / "text" / "aclImdb" / split / label).mkdir(parents=True)
    assert data_available("cifar10", tmp_path) and data_available("imdb", tmp_path)


def test_within_the_chains_spread_holds_both_sides() -> None:
    band = published_accuracy.chain_spread()
    assert published_accuracy.same_computation_spread() < band  # the band is wider than run-to-run noise
    for delta in (-band + 0.01, 0.0, band - 0.01):
        verdict = judge(BF16, run_of(BF16, BF16.published_pct + delta))
        assert verdict.passed, verdict.detail
        assert "within band" in verdict.detail and f"band +-{band:.2f}" in verdict.detail
    assert judge(DISTILBERT, run_of(DISTILBERT, DISTILBERT.published_pct - 0.5)).passed


def test_outside_the_spread_does_not_hold_both_sides() -> None:
    band = published_accuracy.chain_spread()
    below = judge(BF16, run_of(BF16, BF16.published_pct - band - 0.05))
    above = judge(BF16, run_of(BF16, BF16.published_pct + band + 0.05))
    assert not below.passed and not above.passed
    assert f"{-band - 0.05:+.2f} points" in below.detail and "(outside)" in below.detail
    assert f"{band + 0.05:+.2f} points" in above.detail
    assert not judge(DISTILBERT, run_of(DISTILBERT, DISTILBERT.published_pct - band - 0.05)).passed


def test_a_run_that_is_not_the_articles_is_not_compared_blind() -> None:
    right = BF16.published_pct
    cases = {
        "data sklearn-digits, not cifar10": run_of(BF16, right, data="sklearn-digits"),
        "random weights": run_of(BF16, right, weights="random"),
        "schedule 50 optimizer steps, 2000 test examples": run_of(
            BF16, right, accuracy_schedule={"kind": "steps", "optimizer_steps": 50, "test_examples": 2000}),
        "scale gpusmoke": run_of(BF16, right, scale="gpusmoke"),
        "accuracy not measured": dataclasses.replace(run_of(BF16, right), accuracy=None),
    }
    for expected, record in cases.items():
        verdict = judge(BF16, record)
        assert not verdict.passed and expected in verdict.detail and "not comparable" in verdict.detail, verdict.detail


def test_the_catalogue_says_the_gpu_tier_checks_it() -> None:
    from memclaims.claims import runs as claim_runs
    from memclaims.claims.catalogue import CLAIMS_BY_NAME, coverage_problems

    claim = CLAIMS_BY_NAME[published_accuracy.CLAIM]
    assert claim.checks == {"gpu": "suite/cases/test_published_accuracy.py::test_published_accuracy"}
    assert claim.published[f"{BF16.name.split('/')[1]}_pct"] == BF16.published_pct
    assert claim_runs.claims_of("suite/cases/test_published_accuracy.py::test_published_accuracy[gpu:vit_chain/03_bfloat16]") \
        == [(published_accuracy.CLAIM, "gpu")]
    assert coverage_problems() == []
