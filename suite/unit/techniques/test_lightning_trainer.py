"""lightning-trainer's registry entry and its mapping onto the Trainer's switches (memclaims.techniques.lightning_trainer)."""

from __future__ import annotations

import pytest

from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import resolve
from memclaims.techniques import lightning_trainer


def test_the_recipe_is_the_trainers_own_switches() -> None:
    recipe = resolve("vit", "smoke", ("lightning-trainer", "bf16-true", "grad-accum"))
    assert lightning_trainer.trainer_arguments(recipe) == {"precision": "bf16-true", "accumulate_grad_batches": 4}
    assert recipe.stack_hooks is not None and recipe.stack_hooks.sim_builds_on_device()  # Trainer.init_module()


@pytest.mark.parametrize(("other", "why"), [("init-module", "inside its own init_module"), ("fsdp", "a strategy"),
                                            ("fused-linear-ce", "the chunked loss")])
def test_what_the_trainer_cannot_express_is_refused_with_the_reason(other: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        resolve("distilbert-cased", "smoke", ("lightning-trainer", other))
