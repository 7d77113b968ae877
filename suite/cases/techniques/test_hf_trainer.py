"""hf-trainer (issue #42): transformers' Trainer runs the recipe, as the course's 8-bit Adam lesson trains DistilBERT.

- cpu: the course's Trainer code path at smoke scale (``distilbert-cased-smoke/hf-trainer+adam8bit``: the two
  weight-decay groups of ``get_parameter_names`` and the layer-norm classes, bitsandbytes' ``Adam8bit`` passed as
  ``optimizers=(adam_bnb_optim, None)``, the course's ``compute_metrics`` through ``trainer.evaluate()``), visibly at
  work, the course's optimizer-size count over ``trainer.optimizer.state.values()`` equal to memclaims' arithmetic of
  bitsandbytes' layout, against its stored baseline. Its Record is also what the course's claims read
  (``course-adam8bit-128``, ``course-adam8bit-elements``: the xdist group shares it);
- cpu: the Trainer's own default path (``distilbert-cased-smoke/hf-trainer``: no optimizer given, TrainingArguments'
  default ``optim``, what ``Trainer.get_optimizer_cls_and_kwargs`` builds of it), its measured steps against their
  stored baseline: a release that changes the default path moves them (injected in suite/cases/test_regressions.py);
- sim: ``memclaims run distilbert -t hf-trainer -t adam8bit --device sim --scale article`` against its baseline; the
  Trainer's default optimizer (``adamw_torch_fused``) replayed fused, no parameter-sized temporaries where the
  Fabric recipe's foreach Adam keeps them;
- injected: a Trainer that drops ``optimizers=(...)`` and builds its default AdamW, and a checkpointing switch that
  enables nothing, each named by recipe, metric and phase.
"""

from __future__ import annotations

import math

import pytest

from fixtures.injections import memory_part
from memclaims.baselines.compare import compare
from memclaims.core.optim_state import adam8bit_bytes, eight_bit_layout
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import model_parameters, run_recipe
from memclaims.techniques import hf_trainer

WORKLOAD = "distilbert-cased"
COURSE = ("hf-trainer", "adam8bit")  # the course's Trainer path
DEFAULT = ("hf-trainer",)  # no optimizer technique: the Trainer builds its own default
# The xdist group of the course's stack cases and the course claims that read their Records (suite/conftest.py).
COURSE_GROUP = "course-stacks"


def _course(record_cache: RecordCache) -> Record:
    return record_cache.get("cpu", resolve(WORKLOAD, "smoke", COURSE))


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.xdist_group(COURSE_GROUP)
def test_the_courses_trainer_path_is_active_and_matches_its_baseline(record_cache, baseline_check,
                                                                      record_property) -> None:
    from torch import nn
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS

    recipe = resolve(WORKLOAD, "smoke", COURSE)
    record = _course(record_cache)
    assert active.problems(recipe, record) == []
    seen = record.by_technique["hf-trainer"]
    # optimizers=(adam_bnb_optim, None): the Trainer stepped the course's Adam8bit, not an optim of its own; its two
    # groups are the course's (get_parameter_names with the layer-norm classes: weight decay on neither them nor biases).
    assert (seen["optimizer_class"], seen["optim"]) == ("Adam8bit", None)
    assert ALL_LAYERNORM_LAYERS == [nn.LayerNorm]  # what memclaims.measure.optimizers.parameter_groups excludes
    # The course's compute_optimizer_size(trainer.optimizer.state.values()): bitsandbytes' layout, to the byte.
    params = model_parameters(WORKLOAD, "smoke")
    layout = eight_bit_layout()
    elements = sum(2 * p.numel() + (sum(layout.qmap_bytes) // 4 + 2 * math.ceil(p.numel() / layout.blocksize)
                                    if p.numel() >= layout.min_8bit_size else 0) for p in params)
    assert (seen["course_optimizer_size_bytes"], seen["course_optimizer_size_elements"]) == (
        adam8bit_bytes(params), elements), seen
    # The Trainer's loop: zero_grad right after the step, the norm clipped before it.
    assert seen["step_phases"] == ["forward", "backward", "clip_grad_norm", "optimizer_step", "zero_grad"]
    assert record.breakdown["gradients"] == 0, "the previous step's gradients are freed before the next forward"
    assert record.accuracy is not None and record.accuracy > 0.75, f"{record.recipe} did not learn: {record.accuracy}"
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.cpu
def test_the_trainers_own_default_optimizer_is_active_and_matches_its_baseline(record_cache, baseline_check,
                                                                              record_property) -> None:
    """The measured steps only (the Record suite/cases/test_regressions.py's clean run of the recipe shares): 3 s."""
    import dataclasses

    from transformers import TrainingArguments

    recipe = resolve(WORKLOAD, "smoke", DEFAULT)
    record = record_cache.memory("cpu", recipe)
    assert active.problems(recipe, record) == []
    seen, built = record.by_technique["hf-trainer"], hf_trainer.trainer_built(recipe)
    default = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim")
    assert seen["optim"] == str(getattr(default, "value", default))  # nothing asked: TrainingArguments' own
    assert (seen["optimizer_class"], seen["fused"] is True) == (built.optimizer_class, built.fused), seen
    assert record.optimizer_state_bytes > 0 and seen["step_phases"][-2:] == ["optimizer_step", "zero_grad"]
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.sim
def test_sim_article_scale_matches_its_baseline(record_cache, baseline_check, record_property) -> None:
    """The issue's command: memclaims run distilbert -t hf-trainer -t adam8bit --device sim --scale article."""
    recipe = resolve("distilbert", "article", COURSE)
    record = record_cache.get("sim", recipe)
    assert active.problems(recipe, record) == []
    assert record.phases["clip_grad_norm"]["allocated_bytes"] > 0  # the Trainer's order, replayed
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


@pytest.mark.sim
@pytest.mark.slow  # two article-scale replays (about 12 s under load); CI keeps the sim baseline above
def test_sim_the_trainers_default_step_is_fused(record_cache) -> None:
    """transformers 5.x's default optim, adamw_torch_fused: the step allocates nothing parameter-sized beyond the
    state, where the same recipe through Fabric (foreach Adam of the profile's era) holds at least one
    parameter-sized list of temporaries."""
    trainer = record_cache.get("sim", resolve("distilbert", "article", ("hf-trainer",)))
    fabric = record_cache.get("sim", resolve("distilbert", "article", ("fabric",)))
    assert trainer.by_technique["hf-trainer"]["fused"] is True

    def temporaries(record: Record) -> int:
        state = record.param_bytes + record.grad_bytes + record.optimizer_state_bytes
        return int(record.phases["optimizer_step"]["allocated_bytes"]) - state

    # Beyond the model state, both hold what lives through the step anyway (the batch, the loss, cuBLAS's workspaces:
    # 19.6 MB at this scale, 7 % of the parameters); only Fabric's holds parameter-sized lists besides.
    assert temporaries(trainer) < 0.1 * trainer.param_bytes, (temporaries(trainer), trainer.param_bytes)
    assert temporaries(fabric) - temporaries(trainer) >= fabric.param_bytes, (temporaries(fabric), fabric.param_bytes)


def inject_optimizers_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Trainer that drops the optimizer it was given (``optimizers=(adam_bnb_optim, None)``) and builds its default
    ``adamw_torch_fused`` instead: the course's 8-bit states silently gone."""
    from transformers import Trainer

    original = Trainer.create_optimizer

    def create_optimizer(self: Trainer, model: object = None) -> object:
        self.optimizer = None
        return original(self, model)

    monkeypatch.setattr(Trainer, "create_optimizer", create_optimizer)


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.xdist_group(COURSE_GROUP)
def test_a_trainer_that_drops_the_courses_optimizer_is_caught(record_cache, monkeypatch) -> None:
    clean = memory_part(_course(record_cache))
    inject_optimizers_dropped(monkeypatch)
    recipe = resolve(WORKLOAD, "smoke", COURSE)
    injected = run_recipe(recipe, RunOptions(device="cpu", evaluate=False))[0]
    comparison = compare(injected, clean, case_id=f"cpu:{injected.recipe}")
    message = "\n".join(([comparison.message()] if comparison.failures else []) + active.problems(recipe, injected))
    for named in ("distilbert-cased-smoke/hf-trainer+adam8bit", "adam8bit is not active", "no uint8 optimizer state",
                  "hf-trainer is not active: the Trainer stepped AdamW after phase optimizer_step, expected Adam8bit",
                  "phases.optimizer_step"):
        assert named in message, message


@pytest.mark.cpu
@pytest.mark.slow  # two more runs of the Trainer (about 10 s on 2 cores); CI keeps the optimizer injection above
def test_a_checkpointing_switch_that_enables_nothing_is_caught(monkeypatch) -> None:
    from transformers import PreTrainedModel

    recipe = resolve(WORKLOAD, "smoke", ("hf-trainer", "activation-checkpointing"))
    without = run_recipe(resolve(WORKLOAD, "smoke", ("hf-trainer",)), RunOptions(device="cpu", evaluate=False))[0]
    clean = run_recipe(recipe, RunOptions(device="cpu", evaluate=False))[0]
    assert active.problems(recipe, clean, {"activation-checkpointing": without}) == []
    for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
        if hasattr(PreTrainedModel, name):
            monkeypatch.setattr(PreTrainedModel, name, lambda self, *args, **kwargs: None)
    injected = run_recipe(recipe, RunOptions(device="cpu", evaluate=False))[0]
    comparison = compare(injected, clean, case_id=f"cpu:{injected.recipe}")
    problems = active.problems(recipe, injected, {"activation-checkpointing": without})
    message = "\n".join(([comparison.message()] if comparison.failures else []) + problems)
    for named in ("distilbert-cased-smoke/hf-trainer+activation-checkpointing",
                  "activation-checkpointing is not active: no nn.Linear ran inside the first backward pass",
                  "the model's activation checkpointing is False after phase load, the Trainer was asked for True",
                  "phases.forward.above_start_bytes"):
        assert named in message, message
