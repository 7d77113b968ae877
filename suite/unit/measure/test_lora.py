"""Units of the lora technique: its active check on constructed Records, the sim's ``Module.to`` while peft wraps
fake tensors, and a workload whose target modules match nothing refused in one line."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.measure import active
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import parse_id, resolve
from memclaims.techniques import lora as lora_technique
from memclaims.techniques.impl import peft_adapters as lora
from memclaims.techniques.impl.peft_adapters_fake import _fake_to
from memclaims.workloads.registry import workload
from memclaims.workloads.types import LoraTargets

RECIPE = resolve("distilbert", "smoke", ("lora",))
TOTAL, TRAINABLE, TENSORS = 100_000, 2_000, 40


def _record(trainable: int | None = TRAINABLE, total: int | None = TOTAL, **changes: object) -> object:
    """A lora Record; ``trainable``, ``total``: lora's observations (None: not observed)."""
    values = dict(recipe=RECIPE.id, workload="distilbert", techniques=["lora"], precision="32-true",
                  param_count=TOTAL, param_tensor_count=TENSORS, param_bytes=4 * TOTAL, grad_bytes=4 * TRAINABLE,
                  optimizer_state_bytes=8 * TRAINABLE + 4 * TENSORS, step_examples=RECIPE.batch_size,
                  step_micro_batches=1, compute_dtypes=["float32"])
    values.update(changes)
    seen = {k: v for k, v in (("trainable_parameters", trainable), ("total_parameters", total)) if v is not None}
    return fake_record(**values, by_technique={"lora": seen} if seen else {})


def _lora_lines(record: object) -> list[str]:
    return [line for line in active.problems(RECIPE, record) if "lora is not active" in line]  # type: ignore[arg-type]


def test_adapters_with_state_for_them_only_are_active() -> None:
    assert _lora_lines(_record()) == []


def test_everything_trainable_is_named_with_the_fraction_and_phase() -> None:
    (line,) = _lora_lines(_record(trainable=TOTAL, optimizer_state_bytes=8 * TOTAL))
    assert line.startswith(f"{RECIPE.id}: lora is not active: trainable_parameters is 100,000 of 100,000 (100.0%) "
                           "after phase load"), line


def test_state_kept_for_frozen_weights_is_named() -> None:
    (line,) = _lora_lines(_record(optimizer_state_bytes=8 * TOTAL))
    assert "optimizer_state_bytes is 800,000 B after phase optimizer_step" in line, line
    assert "frozen base weights" in line


def test_a_run_that_saw_no_adapted_model_is_named() -> None:
    (line,) = _lora_lines(_record(trainable=None, total=None))
    assert "trainable_parameters is None" in line and "phase load" in line


def test_parameter_fields_count_what_requires_a_gradient() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    assert lora.parameter_fields(model) == {"trainable_parameters": 10, "total_parameters": 30,
                                            "quantized_parameter_bytes": None}


def test_the_sims_module_to_converts_only_a_changed_dtype_and_is_restored() -> None:
    moved: list[torch.dtype] = []
    original = nn.Module.to
    module = nn.Linear(2, 2)
    with _fake_to(lambda m, dtype: moved.append(dtype)):
        assert module.to("cpu") is module and module.to(torch.float32) is module
        assert moved == []  # nothing changes: no new storage
        module.to("cpu", dtype=torch.bfloat16)
        assert moved == [torch.bfloat16]
    assert nn.Module.to is original


def test_target_modules_that_match_nothing_are_one_line() -> None:
    work = dataclasses.replace(workload("distilbert"), lora_targets=LoraTargets(("no_such_projection",)))
    model, _ = work.build_model(work.scale("smoke"))
    with pytest.raises(UsageError, match="workload 'distilbert''s lora target_modules no_such_projection: the model of "
                                         "workload 'distilbert' has no module named no_such_projection; its modules: "
                                         "word_embeddings, position_embeddings, LayerNorm, q_lin, k_lin, v_lin"):
        lora.apply(model, work.name, lora_technique.effective(work, None), asked=False)


def test_an_asked_target_the_model_lacks_names_the_option_and_the_modules_it_has() -> None:
    """Even where another asked target exists (peft itself refuses only a list that matches nothing)."""
    work = workload("distilbert")
    model, _ = work.build_model(work.scale("smoke"))
    asked = lora_technique.LoraParameters(target_modules=("q_lin", "q_proj"))
    with pytest.raises(UsageError) as refused:
        lora.apply(model, work.name, lora_technique.effective(work, asked), asked=True)
    text = str(refused.value)
    assert text.startswith("--lora-targets q_lin,q_proj: the model of workload 'distilbert' has no module named "
                           "q_proj; its modules: ") and "\n" not in text, text
    assert {"q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"} <= set(text.rpartition(": ")[2].split(", "))


# --- parameters (issue #53): ids, defaults, refusals ----------------------------------------------


def test_defaults_keep_todays_ids_and_asked_values_name_their_own_recipe() -> None:
    """What equals the workload's default (distilbert: r 8, alpha 16, dropout 0.1 on q_lin and v_lin) leaves the id
    as every stored baseline has it; what differs is in the id, and the id reads back as the same recipe."""
    same = lora_technique.LoraParameters(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=("q_lin", "v_lin"))
    assert resolve("distilbert", "smoke", ("lora",), parameters=[same]).id == "distilbert-smoke/lora"
    assert resolve("distilbert", "smoke", ("lora",), parameters=[same]).parameters == ()
    asked = lora_technique.LoraParameters(r=4, lora_dropout=0.05, target_modules=("q_lin", "k_lin", "v_lin"))
    recipe = resolve("distilbert", "smoke", ("bf16-true", "qlora"), parameters=[asked])
    assert recipe.id == "distilbert-smoke/bf16-true+qlora[r=4,dropout=0.05,targets=q_lin+k_lin+v_lin]"
    assert recipe.techniques == ("bf16-true", "qlora")  # the Record's techniques stay names
    again = parse_id(recipe.id)
    assert again.id == recipe.id and again.parameters == recipe.parameters
    chosen = lora_technique.effective(recipe.workload, recipe.parameters_of("qlora"))
    assert chosen == {"r": 4, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ("q_lin", "k_lin", "v_lin"),
                      "modules_to_save": ("classifier",)}


@pytest.mark.parametrize(("techniques", "message"), [
    (("lora[r=0]",), "--lora-r 0: expected a positive integer"),
    (("lora[r=2.5]",), "--lora-r 2.5: expected a positive integer"),
    (("lora[alpha=0]",), "--lora-alpha 0: expected a number above 0"),
    (("lora[dropout=1]",), "--lora-dropout 1: expected a probability in [0, 1)"),
    (("lora[rank=4]",), "malformed lora parameter 'rank=4' in a recipe id"),
    (("bf16-true[r=4]",), "technique 'bf16-true' takes no parameters"),
])
def test_bad_parameters_are_one_line_naming_the_option_and_value(techniques: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve("distilbert", "smoke", techniques)


def test_parameters_without_a_technique_to_take_them_are_refused() -> None:
    with pytest.raises(UsageError, match=re.escape("--lora-r: for -t lora or -t qlora, which the recipe (bf16-true) "
                                                   "does not have")):
        resolve("distilbert", "smoke", ("bf16-true",), parameters=[lora_technique.LoraParameters(r=4)])


def test_a_user_workloads_define_states_its_own_defaults() -> None:
    """``define(lora={...})``: the workload takes lora, its own r (4) is the default its id leaves out, and the run
    trains what its shapes say: r * (in + out) per adapted layer, and the head in full."""
    from fixtures import tensor_parallel_user as mlp
    from memclaims.sim import simulate
    from memclaims.workloads import user

    user.register(mlp.make())
    try:
        assert resolve(mlp.NAME, "smoke", ("lora",)).id == f"{mlp.NAME}-smoke/lora"
        asked = resolve(mlp.NAME, "smoke", ("lora",), parameters=[lora_technique.LoraParameters(r=8)])
        assert asked.id == f"{mlp.NAME}-smoke/lora[r=8]"
        width, depth = mlp.SHAPES["smoke"]
        head = width * mlp.CLASSES + mlp.CLASSES
        for recipe, r in ((resolve(mlp.NAME, "smoke", ("lora",)), 4), (asked, 8)):
            assert simulate(recipe).observed("lora", "trainable_parameters") == depth * r * (width + 4 * width) + head
        with pytest.raises(UsageError, match="define\\('x', lora=...\\) needs target_modules"):
            user.define("x", build_model=mlp.Net, train_data=list, test_data=list, block_class=mlp.Block,
                        num_classes=4, lora={"r": 4})
    finally:
        user.forget(mlp.NAME)
