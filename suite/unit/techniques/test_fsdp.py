"""The fsdp techniques' strategy (memclaims.techniques.fsdp.Fsdp): each entry's plan, what a rank says ran, what
the ranks refuse and what the chain's floor may remove."""

from __future__ import annotations

import dataclasses

import pytest

from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import resolve
from memclaims.techniques.base import FSDP1_API, FSDP2_API
from memclaims.techniques.technique_registry import BY_NAME

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize(("name", "api", "sharding", "reshard", "mesh"), [
    ("fsdp", FSDP1_API, "FULL_SHARD", True, None),
    ("fsdp-shard-grad-op", FSDP1_API, "SHARD_GRAD_OP", False, None),
    ("fsdp-no-shard", FSDP1_API, "NO_SHARD", True, (4, 1)),
    ("fsdp-hybrid", FSDP1_API, "HYBRID_SHARD", True, (2, 2)),
    ("fsdp2", FSDP2_API, "FULL_SHARD", True, None),
    ("fsdp2-no-reshard", FSDP2_API, "SHARD_GRAD_OP", False, None),
])
def test_each_fsdp_technique_plans_its_own_sharding(name, api, sharding, reshard, mesh) -> None:
    plan = resolve("vit", "smoke", [name]).strategy_plan(4)
    assert (plan.fsdp_api, plan.sharding_strategy, plan.reshard_after_forward, plan.mesh_shape) == \
        (api, sharding, reshard, mesh)
    # FSDPStrategy moves the model before it wraps it and casts its collectives by Lightning's FSDPPrecision;
    # FSDP2's groups move themselves and run in the parameters' dtype.
    assert plan.setup_moves_model is plan.mixed_precision_policy is (api == FSDP1_API)
    assert plan.wrap_blocks and not plan.checkpoint_blocks and not plan.offload_params


def test_hybrid_refuses_ranks_that_do_not_split_into_its_nodes() -> None:
    recipe = resolve("vit", "smoke", ["fsdp-hybrid"])
    strategy = recipe.distributed
    assert strategy is not None
    assert strategy.rank_refusal(recipe, "cuda", 4) is None
    assert "divisible by 2 (got 3)" in (strategy.rank_refusal(recipe, "cuda", 3) or "")


@pytest.mark.parametrize(("name", "cuda_note"), [
    ("fsdp", "rank 1 of 2: Lightning strategy='fsdp'"),
    ("fsdp2-no-reshard", "rank 1 of 2: Lightning ModelParallelStrategy (FSDP2 fully_shard, reshard_after_forward=False)"),
])
def test_a_rank_says_which_fsdp_ran(name: str, cuda_note: str) -> None:
    recipe = resolve("vit", "smoke", [name])
    strategy, plan = recipe.distributed, recipe.strategy_plan(2)
    assert strategy is not None
    assert strategy.rank_notes(plan, 1, "cuda") == [cuda_note]
    cpu = strategy.rank_notes(plan, 1, "cpu")  # the CPU ranks run fully_shard for every FSDP technique
    assert cpu[0] == "rank 1 of 2: FSDP2 fully_shard over gloo on the CPU (Lightning refuses FSDP on the CPU)"
    assert len(cpu) == (2 if name == "fsdp2-no-reshard" else 1)


def test_sharding_removes_at_most_a_share_per_rank_and_nothing_on_one_device() -> None:
    hooks = BY_NAME["fsdp2"].hooks
    after = fake_record("vit-smoke/fsdp2", techniques=["fsdp2"], devices=4)
    removal = hooks.removes(after)
    assert removal is not None and (removal.state, removal.rest, removal.no_verdict) == (0.25, 0.25, None)
    alone = hooks.removes(dataclasses.replace(after, devices=1))
    assert alone is not None and alone.no_verdict == "FSDP over 1 device shards nothing: needs 2 devices"


@pytest.mark.parametrize("techniques", [("fsdp",), ("fsdp", "activation-checkpointing", "cpu-offload"),
                                        ("fsdp-shard-grad-op",), ("fsdp-no-shard",), ("fsdp-hybrid",)])
def test_lightning_configures_what_an_fsdp1_plan_asks(techniques: tuple[str, ...]) -> None:
    """``configured``: the plan as Lightning's FSDPStrategy and FSDPPrecision configure it carries every setting the
    recipe asks, with Lightning's MixedPrecision and policies beside them."""
    recipe = resolve("vit", "smoke", techniques)
    strategy, asked = recipe.distributed, recipe.strategy_plan(4)
    assert strategy is not None
    configured = strategy.configured(asked, recipe, "bf16-mixed")
    same = ("sharding_strategy", "reshard_after_forward", "mesh_shape", "mesh_dim_names", "wrap_blocks",
            "checkpoint_blocks", "offload_params", "setup_moves_model", "mixed_precision_policy", "notes")
    assert {k: getattr(configured, k) for k in same} == {k: getattr(asked, k) for k in same}
    assert (configured.param_dtype, configured.reduce_dtype) == ("bfloat16", "bfloat16")
    assert configured.wrap_policy is not None and configured.configured_by.startswith("Lightning ")
    assert bool(configured.checkpoint_options) is asked.checkpoint_blocks
    assert strategy.configuration_problems(recipe, asked, configured) == []  # type: ignore[attr-defined]
    assert not asked.configured_by  # the recipe's own plan says nobody configured it


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2-no-reshard"])
def test_fsdp2_plans_are_memclaims_own(name: str) -> None:
    """FSDP2 runs memclaims' parallelize_fn (ModelParallelStrategy): no Lightning FSDP configuration to read."""
    recipe = resolve("vit", "smoke", [name])
    strategy, plan = recipe.distributed, recipe.strategy_plan(4)
    assert strategy is not None
    assert strategy.configured(plan, recipe, "bf16-mixed") is plan


def test_a_configuration_that_drops_a_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning.fabric.strategies.fsdp as lightning_fsdp

    recipe = resolve("vit", "smoke", ["fsdp", "activation-checkpointing"])
    strategy, asked = recipe.distributed, recipe.strategy_plan(2)
    assert strategy is not None
    monkeypatch.setattr(lightning_fsdp, "_activation_checkpointing_kwargs", lambda *args: {})
    configured = strategy.configured(asked, recipe, "32-true")
    assert strategy.configuration_problems(recipe, asked, configured) == [  # type: ignore[attr-defined]
        "vit-smoke/fsdp+activation-checkpointing@2, every rank: activation_checkpointing_policy (each block) is False "
        f"as {configured.configured_by} configure it, where the recipe asks True (phase setup: what "
        "FSDPStrategy.setup_module passes to FullyShardedDataParallel)"]


def test_cpu_rank_notes_say_what_lightning_configured() -> None:
    recipe = resolve("vit", "smoke", ["fsdp-shard-grad-op"])
    strategy = recipe.distributed
    assert strategy is not None
    notes = strategy.rank_notes(strategy.configured(recipe.strategy_plan(2), recipe, "32-true"), 0, "cpu")
    assert notes[1].startswith("SHARD_GRAD_OP as FSDP2 runs it")
    assert notes[2].startswith("as Lightning ") and notes[2].endswith(
        "configure it: MixedPrecision(param_dtype=float32, reduce_dtype=float32, buffer_dtype=float32); "
        "auto_wrap_policy=ModuleWrapPolicy({EncoderBlock}); no activation checkpointing; "
        "CPUOffload(offload_params=False); SHARD_GRAD_OP"), notes
