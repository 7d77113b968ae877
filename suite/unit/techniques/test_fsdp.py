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
