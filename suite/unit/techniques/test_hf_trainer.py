"""hf-trainer's registry entry and its mapping of a recipe onto TrainingArguments (memclaims.techniques.hf_trainer):
plain data, no Trainer built (its runs: suite/cases/techniques/test_hf_trainer.py)."""

from __future__ import annotations

import pytest

from memclaims.core.errors import UsageError
from memclaims.measure import optimizers
from memclaims.recipes.recipe import resolve
from memclaims.techniques import hf_trainer


def _arguments(*techniques: str) -> dict[str, object]:
    return hf_trainer.trainer_arguments(resolve("distilbert-cased", "smoke", ("hf-trainer", *techniques)))


def test_the_recipe_is_the_trainers_own_switches() -> None:
    assert _arguments() == dict(per_device_train_batch_size=32, per_device_eval_batch_size=32,
                                gradient_accumulation_steps=1, bf16=False, fp16=False, checkpointing=False,
                                learning_rate=1e-3, weight_decay=0.0, lr_scheduler_type="constant",
                                max_grad_norm=1.0)  # no optim: the Trainer's own default
    combined = _arguments("bf16-mixed", "small-batch", "grad-accum", "activation-checkpointing", "sgd")
    assert {k: combined[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
                                     "checkpointing", "optim", "lr_scheduler_type")} == dict(
        per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True, fp16=False, checkpointing=True,
        optim="sgd", lr_scheduler_type="cosine")
    assert _arguments("16-mixed")["fp16"] is True


@pytest.mark.parametrize(("technique", "optim", "given"), [
    ((), None, None),  # the Trainer's own default (TrainingArguments' optim), Adam with weight decay 0
    (("adamw",), "adamw_torch_fused", None),
    (("sgd",), "sgd", None),
    (("adafactor",), "adafactor", None),
    (("adam8bit",), None, "Adam8bit"),  # the course's Adam8bit, passed as optimizers=(optimizer, None)
    (("adamw8bit",), None, "AdamW8bit"),  # not adamw_bnb_8bit: that one keeps nn.Embedding states in 32 bits
])
def test_the_optimizer_is_the_trainers_optim_or_passed_in(technique: tuple[str, ...], optim: str | None,
                                                          given: str | None) -> None:
    chosen = hf_trainer.trainer_optimizer(resolve("distilbert-cased", "smoke", ("hf-trainer", *technique)))
    assert (chosen.optim, chosen.given) == (optim, given)
    assert ("optim" in _arguments(*technique)) is (optim is not None)


def test_what_the_trainer_builds_is_its_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default path is transformers': TrainingArguments' default optim through get_optimizer_cls_and_kwargs, so a
    release that changes either changes what the real run is checked against and what the sim replays."""
    import dataclasses

    from transformers import Trainer, TrainingArguments

    default = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(report_to="none", use_cpu=True, optim=default))
    built = hf_trainer.trainer_built(resolve("distilbert-cased", "smoke", ("hf-trainer",)))
    assert (built.optimizer_class, built.fused) == (cls.__name__, kwargs.get("fused") is True)
    assert hf_trainer.trainer_built(resolve("distilbert-cased", "smoke", ("hf-trainer", "adam8bit"))).kwargs == {}
    # A release whose default is another optim: the recipe follows it.
    monkeypatch.setattr(Trainer, "get_optimizer_cls_and_kwargs",
                        staticmethod(lambda args, model=None: (torch_sgd(), {"lr": args.learning_rate})))
    assert hf_trainer.trainer_built(resolve("distilbert-cased", "smoke", ("hf-trainer",))).optimizer_class == "SGD"


def torch_sgd() -> type:
    import torch

    return torch.optim.SGD


def test_the_weight_decay_is_the_courses() -> None:
    assert hf_trainer.WEIGHT_DECAY == optimizers.WEIGHT_DECAY
    assert _arguments("adamw")["weight_decay"] == optimizers.WEIGHT_DECAY


@pytest.mark.parametrize(("other", "why"), [
    ("bf16-true", "TrainingArguments has no true half precision"),
    ("fsdp", "a strategy runs the recipe on several ranks"),
    ("lora", "peft's adapters"),
    ("activation-offload", "save_on_cpu around each forward"),
    ("accelerate", "at most one loop technique per recipe"),
])
def test_what_the_trainer_cannot_express_is_refused_with_the_reason(other: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        resolve("distilbert-cased", "smoke", ("hf-trainer", other))


@pytest.mark.parametrize("workload", ["vit", "hf:gpt2"])
def test_a_workload_whose_loss_is_not_the_models_own_is_refused(workload: str) -> None:
    recipe = resolve(workload, "smoke", ("hf-trainer",))
    reason = hf_trainer.workload_refusal(recipe)
    assert reason is not None and f"does not run on workload {workload!r}: the Trainer's loss is the model's own" in reason
    assert hf_trainer.workload_refusal(resolve("distilbert", "smoke", ("hf-trainer",))) is None
