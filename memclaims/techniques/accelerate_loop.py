"""accelerate: the recipe trained by the course's Accelerate loop, ``accelerate.Accelerator`` around a loop of one's own.

The course prepares everything at once (``accelerator.prepare(model, adam_bnb_optim, train_dataloader,
lr_scheduler)``) and steps inside ``accelerator.accumulate(model)`` with ``accelerator.backward(loss)``; the recipe's
core fields are the Accelerator's switches (``accelerator_arguments``): ``mixed_precision`` (autocast: "no", "bf16",
"fp16") and ``gradient_accumulation_steps``, the batch is the loader's, the optimizer the user's own (memclaims',
built as the course builds it). Its loop zeroes the gradients right after each step, so the previous step's gradients
are gone in the next forward, unlike the article scripts' loop without accumulation (``loop_order``). The driver is
``memclaims.measure.stacks.accelerate_driver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.techniques.base import (
    ZERO_AFTER_STEP,
    LoopOrder,
    Say,
    Stack,
    Technique,
)
from memclaims.techniques.shared_conflicts import STACK_REFUSES_FABRIC_HOOKS, STACK_REFUSES_STRATEGIES, STRATEGY

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

NAME = "accelerate"
# Accelerator's mixed_precision for each of the recipe's precisions it expresses (autocast only).
MIXED_PRECISION = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}
EXPRESSES = frozenset({"16-mixed", "bf16-mixed", "small-batch", "grad-accum", "sgd", "adamw", "adam8bit", "adamw8bit",
                       "paged-adamw8bit", "adafactor", "activation-checkpointing", "expandable-segments"})
_TRUE_HALF = ("Accelerator's mixed_precision is autocast only ('no', 'fp16', 'bf16', 'fp8'): a model trained in a half "
              "dtype is the model's own dtype, set by no Accelerator switch")
CONFLICTS: tuple[tuple[str, str], ...] = (
    ("16-true", _TRUE_HALF), ("bf16-true", _TRUE_HALF),
    (STRATEGY, STACK_REFUSES_STRATEGIES),
    *STACK_REFUSES_FABRIC_HOOKS.items(),
)


def accelerator_arguments(recipe: Recipe) -> dict[str, object]:
    """The recipe as the Accelerator's switches (the engine adds ``cpu=`` for the device)."""
    return {"mixed_precision": MIXED_PRECISION[recipe.precision],
            "gradient_accumulation_steps": recipe.accumulation_steps}


class AccelerateLoop(Stack):
    name = NAME
    driver = "memclaims.measure.stacks.accelerate_driver:AccelerateDriver"
    expresses = EXPRESSES

    def loop_order(self, recipe: Recipe) -> LoopOrder:
        # optimizer.step(); lr_scheduler.step(); optimizer.zero_grad() in the loop's body; ``outputs`` stays bound.
        return LoopOrder(zero_grad=ZERO_AFTER_STEP, keeps_output=True)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        super().check(recipe, record, without, say)
        if record.device == "sim":
            return
        expected = accelerator_arguments(recipe)
        for key in ("mixed_precision", "gradient_accumulation_steps"):
            if record.observed(NAME, key) != expected[key]:
                say(f"the Accelerator ran {key}={record.observed(NAME, key)!r} after phase load, the recipe asks {expected[key]!r}")
        # The optimizer's real steps (torch's step hook) against the micro-batches the loop trained: one per window of
        # gradient_accumulation_steps, not what the stack reports as synced.
        steps, micro_batches = record.observed(NAME, "optimizer_steps"), record.observed(NAME, "micro_batches")
        if not isinstance(steps, int) or steps != record.memory_steps or micro_batches != steps * recipe.accumulation_steps:
            say(f"the optimizer stepped {steps} times over {micro_batches} micro-batches in phase train, expected "
                f"{record.memory_steps} (one per {recipe.accumulation_steps} micro-batch(es) under accelerator.accumulate)")


ENTRY = Technique(NAME, "Accelerate runs the course's loop: Accelerator(mixed_precision, gradient_accumulation_steps), "
                  "prepare, accumulate, accelerator.backward, zero_grad after the step",
                  "course: 8-bit Adam lesson (Accelerate)", group="loop", stack=NAME, conflicts=CONFLICTS,
                  in_cover=False, in_default=False, hooks=AccelerateLoop())
