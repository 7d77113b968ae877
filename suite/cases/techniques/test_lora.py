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


# --- parameters asked (issue #53) -----------------------------------------------------------------

# A 2-layer LLaMA: peft's LoRA on its q_proj and v_proj as many published runs adapt it, at rank 4.
SMALL_LLAMA = ("hf:llama(hidden_size=256,intermediate_size=512,num_attention_heads=4,num_hidden_layers=2,"
               "num_key_value_heads=2,vocab_size=1000)")
ASKED = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}


def _peft_trainable(model_type: str, overrides: dict[str, int]) -> int:
    """What peft reports for ``ASKED`` on the same config, built on the meta device apart from memclaims."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **overrides))
    trainable, _ = get_peft_model(model, LoraConfig(**ASKED)).get_nb_trainable_parameters()
    return int(trainable)


def test_adapters_go_on_quietly() -> None:
    """A run with -t lora prints nothing of peft's own: its read of transformers' deprecated alias is not the user's
    warning (a project with ``filterwarnings = error`` would fail on it)."""
    import warnings

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from memclaims.techniques.impl import peft_adapters

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128,
                                                                      num_attention_heads=2, num_hidden_layers=1,
                                                                      num_key_value_heads=2, vocab_size=100))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj"], "modules_to_save": ()}
        peft_adapters.apply(model, "hf:llama", chosen, asked=True)


@pytest.mark.sim
@pytest.mark.parametrize("adapter", ["lora", pytest.param("qlora", marks=pytest.mark.requires(bitsandbytes="cpu"))])
def test_asked_parameters_train_what_peft_reports_and_the_record_says_them(adapter: str) -> None:
    from memclaims.techniques.lora import LoraParameters

    asked = LoraParameters(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=("q_proj", "v_proj"))
    record = simulate(resolve(SMALL_LLAMA, "article", ("bf16-true", adapter), parameters=[asked]))
    assert record.recipe == f"{SMALL_LLAMA}-article/bf16-true+{adapter}[r=4,alpha=8,dropout=0.05,targets=q_proj+v_proj]"
    overrides = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_hidden_layers=2,
                     num_key_value_heads=2, vocab_size=1000)
    # From the shapes too: per layer q_proj 256 -> 256 and v_proj 256 -> 128 (2 of 4 heads), r * (in + out) each.
    trainable = record.observed("lora", "trainable_parameters")
    assert trainable == _peft_trainable("llama", overrides) == 2 * 4 * ((256 + 256) + (256 + 128))
