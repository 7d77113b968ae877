"""memclaims.recipes.recipe: a recipe's strategy (``Recipe.distributed``) and the plan its ranks execute
(``Recipe.strategy_plan``: the strategy's, as each technique of the recipe changes it)."""

from __future__ import annotations

import pytest

from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import resolve
from memclaims.techniques.base import ON_CPU_RANKS, ON_SIM

pytestmark = pytest.mark.cpu


def test_only_a_multi_device_technique_gives_a_recipe_a_strategy() -> None:
    one = resolve("vit", "smoke", ["bf16-true", "activation-checkpointing"])
    assert one.distributed is None
    with pytest.raises(UsageError, match="runs on one device"):
        one.strategy_plan(2)
    for name in ("fsdp", "fsdp2", "ddp", "deepspeed-zero2"):
        assert resolve("vit", "smoke", [name]).distributed is not None, name


def test_the_techniques_beside_a_strategy_change_its_plan() -> None:
    """The article's script 11: checkpointing and offload in the plan, the model left on the host by setup, and
    what delayed-init does on each engine said in the plan's notes."""
    plain = resolve("vit", "smoke", ["fsdp"]).strategy_plan(4)
    plan = resolve("vit", "smoke", ["fsdp", "activation-checkpointing", "cpu-offload", "delayed-init"]).strategy_plan(4)
    assert not (plain.checkpoint_blocks or plain.offload_params) and plain.setup_moves_model and not plain.notes
    assert plan.checkpoint_blocks and plan.offload_params and not plan.setup_moves_model
    assert plan.notes_on(ON_CPU_RANKS) == ["delayed-init changes nothing on the CPU: the model is built on the CPU "
                                           "either way"]
    assert plan.notes_on(ON_SIM)[0].startswith("init_module(empty_init=False) under FSDPStrategy builds on the host")


def test_init_module_beside_a_strategy_says_it_changes_nothing_on_the_cpu_ranks() -> None:
    plan = resolve("vit", "smoke", ["init-module", "fsdp"]).strategy_plan(2)
    assert plan.notes_on(ON_CPU_RANKS) == ["init-module changes nothing on the CPU tier"]
    assert plan.notes_on(ON_SIM) == []
