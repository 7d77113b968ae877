"""accelerate's registry entry and its mapping onto the Accelerator's switches (memclaims.techniques.accelerate_loop)."""

from __future__ import annotations

import pytest

from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import resolve
from memclaims.techniques import accelerate_loop


@pytest.mark.parametrize(("techniques", "arguments"), [
    ((), {"mixed_precision": "no", "gradient_accumulation_steps": 1}),
    (("bf16-mixed", "grad-accum"), {"mixed_precision": "bf16", "gradient_accumulation_steps": 4}),
    (("16-mixed",), {"mixed_precision": "fp16", "gradient_accumulation_steps": 1}),
])
def test_the_recipe_is_the_accelerators_own_switches(techniques: tuple[str, ...], arguments: dict[str, object]) -> None:
    recipe = resolve("distilbert-cased", "smoke", ("accelerate", *techniques))
    assert accelerate_loop.accelerator_arguments(recipe) == arguments


@pytest.mark.parametrize(("other", "why"), [("bf16-true", "Accelerator's mixed_precision is autocast only"),
                                            ("ddp", "a strategy"), ("optimizer-in-backward", "per-parameter optimizers")])
def test_what_accelerate_cannot_express_is_refused_with_the_reason(other: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        resolve("distilbert-cased", "smoke", ("accelerate", other))
