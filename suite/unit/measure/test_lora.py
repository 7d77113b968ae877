"""Units of the lora technique: its active check on constructed Records, the sim's ``Module.to`` while peft wraps
fake tensors, and a workload whose target modules match nothing refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.measure import active
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import resolve
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
    with pytest.raises(UsageError, match="lora: peft cannot put adapters on workload 'distilbert'"):
        lora.apply(model, work)
