"""lightning-trainer (issue #42): Lightning's Trainer runs the recipe (``precision``, ``accumulate_grad_batches``,
``configure_optimizers``), the model built inside ``Trainer.init_module()``.

- cpu: ``distilbert-cased-smoke/lightning-trainer+bf16-true`` (true half precision: no fp32 weights left), visibly at
  work, against its baseline;
- sim: the same recipe at article scale against its baseline, built on the device in bf16;
- injected: true precision that leaves fp32 weights (Lightning#19721's symptom: ``bf16-true`` keeping the model in
  float32), named by recipe, metric and phase.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from fixtures.injections import memory_part
from memclaims.baselines.compare import compare
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import run_recipe

WORKLOAD = "distilbert-cased"
TRUE_HALF = ("lightning-trainer", "bf16-true")
GROUP = "lightning-trainer"  # the clean Record measured once for the case and its injection


def _clean(record_cache: RecordCache) -> Record:
    return record_cache.get("cpu", resolve(WORKLOAD, "smoke", TRUE_HALF))


@pytest.mark.cpu
@pytest.mark.xdist_group(GROUP)
def test_true_precision_is_active_and_matches_its_baseline(record_cache, baseline_check, record_property) -> None:
    recipe = resolve(WORKLOAD, "smoke", TRUE_HALF)
    record = _clean(record_cache)
    assert active.problems(recipe, record) == []
    seen = record.by_technique["lightning-trainer"]
    assert seen["precision"] == "bf16-true" and seen["param_dtypes"] == ["bfloat16"]
    assert seen["built_dtypes"] == ["bfloat16"]  # Trainer.init_module(): never an fp32 copy
    # Automatic optimization: zero_grad inside the closure, after the forward (the scripts' order).
    assert seen["step_phases"] == ["forward", "zero_grad", "backward", "optimizer_step"]
    assert record.param_bytes == 2 * record.param_count and record.load_peak_bytes < 4 * record.param_count
    assert record.accuracy is not None and record.accuracy > 0.75, f"{record.recipe} did not learn: {record.accuracy}"
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.sim
@pytest.mark.slow  # an article-scale replay (about 7 s under load); CI keeps the cpu case and the injection
def test_sim_matches_its_baseline(record_cache, baseline_check, record_property) -> None:
    recipe = resolve(WORKLOAD, "article", TRUE_HALF)
    record = record_cache.get("sim", recipe)
    assert active.problems(recipe, record) == []
    # Built in place in bf16 (init_module): the load holds no fp32 copy of the model.
    assert record.load_peak_bytes < 1.05 * record.param_bytes == 1.05 * 2 * record.param_count
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def inject_true_precision_keeps_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's HalfPrecision that converts nothing: init_module builds in fp32 and setup leaves the weights fp32,
    while the Trainer still reports ``precision='bf16-true'``."""
    from lightning.pytorch.plugins.precision import HalfPrecision

    monkeypatch.setattr(HalfPrecision, "convert_module", lambda self, module: module)
    monkeypatch.setattr(HalfPrecision, "module_init_context", lambda self: nullcontext())
    monkeypatch.setattr(HalfPrecision, "tensor_init_context", lambda self: nullcontext())


@pytest.mark.cpu
@pytest.mark.xdist_group(GROUP)
def test_true_precision_that_keeps_fp32_weights_is_caught(record_cache, monkeypatch) -> None:
    clean = memory_part(_clean(record_cache))
    inject_true_precision_keeps_fp32(monkeypatch)
    recipe = resolve(WORKLOAD, "smoke", TRUE_HALF)
    injected = run_recipe(recipe, RunOptions(device="cpu", evaluate=False))[0]
    comparison = compare(injected, clean, case_id=f"cpu:{injected.recipe}")
    message = "\n".join(([comparison.message()] if comparison.failures else []) + active.problems(recipe, injected))
    for named in ("distilbert-cased-smoke/lightning-trainer+bf16-true",
                  "lightning-trainer is not active: the parameters were ['float32'] after phase train under precision "
                  "'bf16-true', expected ['bfloat16']", "param_bytes", "phases.load"):
        assert named in message, message
    assert {"param_bytes", "optimizer_state_bytes"} <= {r.metric for r in comparison.failures}, message
