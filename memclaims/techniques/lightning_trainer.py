"""lightning-trainer: the recipe trained by Lightning's ``Trainer`` (``lightning.pytorch``), a LightningModule around
the workload's model.

The recipe's core fields are the Trainer's own switches (``trainer_arguments``): ``precision`` (Lightning's own
strings, as Fabric's), ``accumulate_grad_batches``; the batch is the loader's, the optimizer what
``configure_optimizers`` returns (memclaims', as the scripts build it). The model is built inside
``Trainer.init_module()`` (Lightning's way for true half precision: materialized in the half dtype). Automatic
optimization zeroes the gradients inside its closure, after the forward of the first micro-batch of each accumulation
window (``loop_order``): with accumulation the previous step's gradients are alive in the next window's first forward,
unlike the scripts' loop. The driver is ``memclaims.measure.stacks.lightning_trainer_driver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import (
    ZERO_AT_WINDOW_START,
    LoopOrder,
    Say,
    Stack,
    Technique,
)
from memclaims.techniques.shared_conflicts import STACK_REFUSES_FABRIC_HOOKS, STACK_REFUSES_STRATEGIES, STRATEGY

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

NAME = "lightning-trainer"
EXPRESSES = frozenset({"16-mixed", "bf16-mixed", "16-true", "bf16-true", "small-batch", "grad-accum", "sgd", "adamw",
                       "adam8bit", "adamw8bit", "paged-adamw8bit", "adafactor", "activation-checkpointing",
                       "expandable-segments"})
CONFLICTS: tuple[tuple[str, str], ...] = (
    (STRATEGY, STACK_REFUSES_STRATEGIES),
    *((name, reason) for name, reason in STACK_REFUSES_FABRIC_HOOKS.items() if name != "init-module"),
    ("init-module", "the Trainer builds every recipe's model inside its own init_module() already (Lightning's way "
                    "for true half precision); Fabric's init_module is no switch of Lightning's Trainer"),
)


# The parameters' dtype under each true half precision (what Lightning's HalfPrecision converts to).
HALF_DTYPES = {"bf16-true": "bfloat16", "16-true": "float16"}


def trainer_arguments(recipe: Recipe) -> dict[str, Any]:
    """The recipe as Lightning Trainer's switches (the engine adds the device, the steps and the quiet settings)."""
    return {"precision": recipe.precision, "accumulate_grad_batches": recipe.accumulation_steps}


class LightningTrainer(Stack):
    name = NAME
    driver = "memclaims.measure.stacks.lightning_trainer_driver:LightningTrainerDriver"
    expresses = EXPRESSES

    def loop_order(self, recipe: Recipe) -> LoopOrder:
        return LoopOrder(zero_grad=ZERO_AT_WINDOW_START, keeps_output=False)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        super().check(recipe, record, without, say)
        if record.device == "sim":
            return
        expected = trainer_arguments(recipe)
        for key in ("precision", "accumulate_grad_batches"):
            if record.observed(NAME, key) != expected[key]:
                say(f"the Trainer ran {key}={record.observed(NAME, key)!r} after phase load, the recipe asks {expected[key]!r}")
        half = HALF_DTYPES.get(recipe.precision)
        if half is not None and record.observed(NAME, "param_dtypes") != [half]:  # Lightning#19721: bf16-true kept fp32 weights
            say(f"the parameters were {record.observed(NAME, 'param_dtypes')} after phase train under precision "
                f"{recipe.precision!r}, expected [{half!r}]")

    def sim_builds_on_device(self) -> bool:
        return True  # Trainer.init_module(): on the device, in the half dtype for true precisions


ENTRY = Technique(NAME, "Lightning's Trainer runs the loop: precision, accumulate_grad_batches, configure_optimizers; "
                  "zero_grad after the first forward of each accumulation window", "Lightning Trainer (automatic "
                  "optimization)", group="loop", stack=NAME, conflicts=CONFLICTS, in_cover=False, in_default=False,
                  hooks=LightningTrainer())
