"""memclaims.measure.distributed without starting ranks: what it asks of a recipe's strategy. A strategy it does not
know by name (``fixtures.toy_strategy``) is refused by its own reasons and executed by its plan on the CPU ranks."""

from __future__ import annotations

import pytest

from fixtures import toy_strategy
from memclaims.core.errors import UsageError
from memclaims.measure.distributed import CpuShardedEngine, check_distributed
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions

pytestmark = pytest.mark.cpu


def test_a_new_strategy_refuses_by_its_own_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    toy_strategy.register(monkeypatch)
    recipe = resolve("vit", "smoke", [toy_strategy.NAME])
    with pytest.raises(UsageError, match=f"the toy refuses {toy_strategy.REFUSED_WORLD} ranks"):
        check_distributed(recipe, "cpu", toy_strategy.REFUSED_WORLD)
    check_distributed(recipe, "cpu", 2)
    # Not a Lightning strategy on the CPU: the CPU ranks' engine splits each micro-batch over the ranks.
    with pytest.raises(UsageError, match="does not split evenly"):
        check_distributed(recipe, "cpu", recipe.micro_batch_size + 1)


def test_the_cpu_ranks_execute_a_new_strategy_by_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine writes the strategy's notes, then its own, then the plan's, and hands the model to the
    strategy's parallelize with the plan's mesh (none asked for)."""
    toy = toy_strategy.register(monkeypatch)
    recipe = resolve("vit", "smoke", [toy_strategy.NAME])
    engine = CpuShardedEngine(recipe, RunOptions(device="cpu", evaluate=False), 1, 2)
    assert engine.notes == ["rank 1 of 2: the toy on cpu", "toy: every rank keeps the whole model"]
    model, _ = engine.build()
    assert toy.calls == [("parallelize", 2, None, "vit")]
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in recipe.workload.build_model(recipe.scale)[0].parameters())


def test_fsdp_on_the_cpu_ranks_is_planned_as_fully_shard_over_a_mesh() -> None:
    """FSDP's notes and plan on a CPU rank: HYBRID_SHARD as HSDP over (replicate 2, shard N/2)."""
    recipe = resolve("vit", "smoke", ["fsdp-hybrid"])
    engine = CpuShardedEngine(recipe, RunOptions(device="cpu", evaluate=False), 0, 4)
    assert engine.notes[0] == "rank 0 of 4: FSDP2 fully_shard over gloo on the CPU (Lightning refuses FSDP on the CPU)"
    assert engine.notes[1].startswith("HYBRID_SHARD as FSDP2 runs it: HSDP over a (replicate 2, shard N/2)")
    assert (engine.plan.mesh_shape, engine.plan.mesh_dim_names) == ((2, 2), ("replicate", "shard"))
