"""accelerate (issue #42): the course's Accelerate loop (``accelerator.prepare(model, adam_bnb_optim, train_dataloader,
lr_scheduler)``, ``accelerator.backward(loss)`` inside ``accelerator.accumulate(model)``).

- cpu: the course's loop at smoke scale with its mixed precision (bf16 on the CPU, where Accelerate has no fp16) and
  bitsandbytes' Adam8bit (``distilbert-cased-smoke/accelerate+bf16-mixed+adam8bit``), visibly at work, the course's
  optimizer-size count over the prepared optimizer's state equal to memclaims' arithmetic, against its baseline;
  its Record is also what the course's claims read (the xdist group shares it);
- cpu: gradient accumulation (``vit-smoke/accelerate+grad-accum``): the optimizer's real steps (torch's step hook on
  the optimizer inside accelerate's wrapper) one per window of micro-batches, not the steps the stack reports, against
  its stored baseline; a wrapper that steps on every micro-batch is injected in suite/cases/test_regressions.py;
- sim: the same recipe at the course's scale against its baseline; the loop zeroes after the step, so the previous
  step's gradients are not alive in the next forward as they are in the Fabric recipe's (the scripts' order);
- injected: Accelerate's mixed precision silently off (the forward no longer under autocast), named by recipe, metric
  and phase.
"""

from __future__ import annotations

from contextlib import ContextDecorator
from typing import Any

import pytest

from fixtures.injections import memory_part
from memclaims.baselines.compare import compare
from memclaims.core.optim_state import adam8bit_bytes
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import model_parameters, run_recipe

WORKLOAD = "distilbert-cased"
COURSE = ("accelerate", "bf16-mixed", "adam8bit")  # the course's Accelerate loop, its mixed precision in bf16
COURSE_GROUP = "course-stacks"  # shared with the course's claims (suite/conftest.py)
ACCUMULATING = ("accelerate", "grad-accum")  # on the ViT (any workload's loss: the loop's own cross-entropy)


def _course(record_cache: RecordCache) -> Record:
    return record_cache.get("cpu", resolve(WORKLOAD, "smoke", COURSE))


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.xdist_group(COURSE_GROUP)
def test_the_courses_accelerate_loop_is_active_and_matches_its_baseline(record_cache, baseline_check,
                                                                         record_property) -> None:
    recipe = resolve(WORKLOAD, "smoke", COURSE)
    record = _course(record_cache)
    assert active.problems(recipe, record) == []
    seen = record.by_technique["accelerate"]
    assert (seen["mixed_precision"], seen["optimizer_steps"]) == ("bf16", record.memory_steps)
    assert record.compute_dtypes == ["bfloat16"] and record.param_bytes == 4 * record.param_count  # autocast only
    assert seen["course_optimizer_size_bytes"] == adam8bit_bytes(model_parameters(WORKLOAD, "smoke"))
    assert seen["step_phases"] == ["forward", "backward", "optimizer_step", "zero_grad"]
    assert record.accuracy is not None and record.accuracy > 0.75, f"{record.recipe} did not learn: {record.accuracy}"
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.cpu
def test_accumulation_steps_the_optimizer_once_per_window_and_matches_its_baseline(record_cache, baseline_check,
                                                                                   record_property) -> None:
    """The measured steps only (the Record suite/cases/test_regressions.py's clean run of the recipe shares)."""
    recipe = resolve("vit", "smoke", ACCUMULATING)
    record = record_cache.memory("cpu", recipe)
    assert active.problems(recipe, record) == []
    seen = record.by_technique["accelerate"]
    assert recipe.accumulation_steps > 1
    assert (seen["gradient_accumulation_steps"], seen["optimizer_steps"], seen["micro_batches"]) == (
        recipe.accumulation_steps, record.memory_steps, recipe.accumulation_steps * record.memory_steps), seen
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.sim
@pytest.mark.slow  # two article-scale replays (about 11 s under load); CI keeps the cpu case and the injection
def test_sim_matches_its_baseline_and_frees_the_gradients_before_the_forward(record_cache, baseline_check,
                                                                             record_property) -> None:
    recipe = resolve(WORKLOAD, "article", COURSE)
    record = record_cache.get("sim", recipe)
    assert active.problems(recipe, record) == []
    fabric = record_cache.get("sim", resolve(WORKLOAD, "article", COURSE[1:]))
    # The same step but for where the gradients are freed: the forward's peak falls by about the gradients.
    fall = fabric.phases["forward"]["allocated_bytes"] - record.phases["forward"]["allocated_bytes"]
    assert 0.9 * fabric.grad_bytes <= fall <= 1.1 * fabric.grad_bytes, (fall, fabric.grad_bytes)
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def inject_mixed_precision_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's prepared forward no longer under autocast: ``mixed_precision="bf16"`` still reported, the model
    computing in fp32 (a context manager that stopped applying, as a renamed autocast argument would leave it)."""
    import accelerate.accelerator

    class NoAutocast(ContextDecorator):  # prepare_model decorates the forward with it
        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    monkeypatch.setattr(accelerate.accelerator, "get_mixed_precision_context_manager",
                        lambda *args, **kwargs: NoAutocast())


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.xdist_group(COURSE_GROUP)
def test_mixed_precision_silently_off_is_caught(record_cache, monkeypatch) -> None:
    clean = memory_part(_course(record_cache))
    inject_mixed_precision_off(monkeypatch)
    recipe = resolve(WORKLOAD, "smoke", COURSE)
    injected = run_recipe(recipe, RunOptions(device="cpu", evaluate=False))[0]
    comparison = compare(injected, clean, case_id=f"cpu:{injected.recipe}")
    message = "\n".join(([comparison.message()] if comparison.failures else []) + active.problems(recipe, injected))
    for named in ("distilbert-cased-smoke/accelerate+bf16-mixed+adam8bit",
                  "bf16-mixed is not active: the linear layers computed in ['float32']", "phases.forward"):
        assert named in message, message
    assert any(r.metric.startswith("phases.forward") for r in comparison.failures), message
