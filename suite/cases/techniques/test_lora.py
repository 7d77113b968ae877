"""The lora technique (issue #27: peft's LoRA adapters) on DistilBERT: at smoke scale on the cpu tier and at
the article's scale on the simulated GPU, each run visibly at work and against its stored baseline, a ViT
refused with the reason, and on the sim a peft that silently puts no adapters on the model named by recipe,
metric and phase (the cpu tier's injection is suite/cases/test_regressions.py's).

The claim from peft's README is suite/cases/test_claims.py's (``lora-few-trainable-parameters``).
"""

from __future__ import annotations

import pytest

from fixtures.injections import inject_lora_not_applied
from memclaims.baselines.compare import compare
from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.sim import simulate

LORA = ("lora",)


def _get(record_cache: RecordCache, tier: str, techniques: tuple[str, ...]) -> Record:
    return record_cache.get(tier, resolve("distilbert", "smoke" if tier == "cpu" else "article", techniques))


@pytest.mark.cpu
def test_a_vit_is_refused_with_the_reason() -> None:
    with pytest.raises(UsageError, match="technique 'lora' does not run on workload 'vit': peft's LoRA adapters go on "
                                         "the attention projections of the text workloads"):
        resolve("vit", "smoke", LORA)


@pytest.mark.parametrize("tier", [pytest.param("cpu", marks=pytest.mark.cpu), pytest.param("sim", marks=pytest.mark.sim)])
def test_lora_is_active_and_matches_its_baseline(tier, record_cache, baseline_check, record_property) -> None:
    recipe = resolve("distilbert", "smoke" if tier == "cpu" else "article", LORA)
    record = _get(record_cache, tier, LORA)
    assert active.problems(recipe, record) == []
    # Gradients for the trainable parameters only; the frozen base weights keep none, and no optimizer state.
    seen = record.by_technique["lora"]
    assert record.grad_bytes == 4 * seen["trainable_parameters"]
    assert seen["total_parameters"] == record.param_count
    baseline_check.check(f"{tier}:{record.recipe}", record, record_property)


@pytest.mark.sim
def test_sim_peft_that_puts_no_adapters_on_is_caught(record_cache, monkeypatch) -> None:
    clean = _get(record_cache, "sim", LORA)
    inject_lora_not_applied(monkeypatch)
    recipe = resolve("distilbert", "article", LORA)
    injected = simulate(recipe)
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    message = "\n".join(([comparison.message()] if comparison.failures else []) + active.problems(recipe, injected))
    # The active check names the fraction (everything trains); the comparison names the state it costs.
    for named in ("distilbert-article/lora", "lora is not active", "trainable_parameters", "phase load",
                  "optimizer_state_bytes", "phases.optimizer_step.above_start_bytes"):
        assert named in message, message
    assert "optimizer_state_bytes" in {r.metric for r in comparison.failures}, message
