"""The nightly budget: the accuracy schedule a Record declares, and the per-case cost model."""

from __future__ import annotations

import dataclasses

import pytest

from memclaims.measure.runner import run
from memclaims.recipes.recipe import for_workload, resolve
from memclaims.recipes.run_options import RunOptions, accuracy_schedule
from memclaims.report import budget
from memclaims.techniques import technique_registry as registry


def test_article_scale_has_a_budgeted_schedule_and_full_epochs_on_request() -> None:
    recipe = resolve("vit", "article", ("bf16-true",))
    assert accuracy_schedule(recipe, RunOptions()) == {
        "kind": "steps", "epochs": None, "optimizer_steps": 50, "test_examples": 2000, "plateau": False}
    weekly = accuracy_schedule(recipe, RunOptions(accuracy_full_epochs=True))
    assert weekly["kind"] == "epochs" and weekly["epochs"] == 1 and weekly["test_examples"] is None
    assert accuracy_schedule(recipe, RunOptions(accuracy_epochs=2))["epochs"] == 2
    # The recipe the article saw diverge near batch 300 trains long enough to show it.
    assert accuracy_schedule(resolve("vit", "article", ("16-true",)), RunOptions())["optimizer_steps"] == 400
    assert accuracy_schedule(resolve("vit", "article", ("16-true", "sgd")), RunOptions())["optimizer_steps"] == 50
    # The cpu tier's smoke scale keeps whole epochs, as before.
    assert accuracy_schedule(resolve("vit", "smoke", ("fabric",)), RunOptions())["kind"] == "epochs"


def test_a_budgeted_run_trains_its_steps_scores_its_examples_and_declares_them(monkeypatch) -> None:
    recipe = resolve("vit", "smoke", ("bf16-true",))
    budgeted = dataclasses.replace(recipe, scale=dataclasses.replace(recipe.scale, accuracy_steps=7,
                                                                     accuracy_test_examples=20))
    from memclaims.measure import loop

    calls: list[int] = []
    original = loop.TrainingLoop.train

    def counting(self, model, optimizer, scheduler, batches, optimizer_steps, on_step=None, **phases):
        calls.append(optimizer_steps)
        return original(self, model, optimizer, scheduler, batches, optimizer_steps, on_step, **phases)

    monkeypatch.setattr(loop.TrainingLoop, "train", counting)
    record = run(budgeted, RunOptions(memory_steps=2))
    assert calls == [2, 7]  # the memory steps, then the budget (not an epoch: -1)
    assert record.accuracy_schedule == {"kind": "steps", "epochs": None, "optimizer_steps": 7, "test_examples": 20,
                                        "plateau": False}  # smoke: trained for a budget, not to its plateau
    assert round(record.accuracy * 20) == pytest.approx(record.accuracy * 20, abs=1e-6)  # scored on 20 images


def test_nightly_selection_fits_thirty_h100_minutes_and_weekly_does_not() -> None:
    def minutes(**options) -> float:
        cases = [(resolve("vit", "article", t), RunOptions(device="cuda", **options))
                 for t in for_workload("vit", registry.default_selection())]
        return budget.total_minutes(cases, cifar=True)

    nightly, weekly = minutes(), minutes(accuracy_full_epochs=True)
    assert nightly < 30 < weekly
    # The model follows the work: fp32 costs more than bf16 per example, and so does a longer budget.
    fp32, bf16 = (budget.estimate(resolve("vit", "article", t), RunOptions(), cifar=True)
                  for t in (("fabric",), ("bf16-true",)))
    assert fp32.train_examples == bf16.train_examples == (3 + 50) * 64 and fp32.seconds > bf16.seconds


def test_flops_per_example_is_six_n_t_plus_attention() -> None:
    recipe = resolve("vit", "article", ("fabric",))
    params, tokens, layers, width = budget._shape(recipe)
    assert (tokens, layers, width) == (197, 24, 1024) and params == 303_311_882
    assert budget.train_flops_per_example(recipe) == pytest.approx(6 * params * 197 + 12 * 24 * 197**2 * 1024)


@pytest.mark.parametrize(("workload", "scale"), [("vit", "article"), ("vit", "gpusmoke"), ("vit", "smoke"),
                                                 ("vit-h14", "article"), ("vit-h14", "gpusmoke")])
def test_parameter_count_from_sizes_matches_the_model(workload: str, scale: str) -> None:
    import torch

    recipe = resolve(workload, scale, ("fabric",))
    from memclaims.workloads.vit import VIT_FAMILIES

    with torch.device("meta"):
        model = VIT_FAMILIES[workload].architecture(scale, recipe.workload.num_classes)
    params, tokens, layers, width = budget._shape(recipe)
    assert params == sum(p.numel() for p in model.parameters())
    assert (tokens, layers, width) == ((model.image_size // model.patch_size) ** 2 + 1, len(model.encoder.layers),
                                       model.hidden_dim)
