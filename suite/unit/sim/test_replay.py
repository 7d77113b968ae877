"""memclaims.sim.replays' dispatch of a recipe with a strategy: the strategy's ``sim_replay`` and plan decide, so a
strategy the sim does not know by name (``fixtures.toy_strategy``) replays as its plan says."""

from __future__ import annotations

import pytest

from fixtures import toy_strategy
from memclaims import sim
from memclaims.recipes.recipe import resolve

pytestmark = pytest.mark.sim


def test_a_new_strategy_replays_as_one_device_with_its_plans_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    toy_strategy.register(monkeypatch)
    toy = sim.simulate(resolve("vit", "smoke", [toy_strategy.NAME]))
    alone = sim.simulate(resolve("vit", "smoke", []))
    assert "toy: replayed as one device" in toy.notes
    assert "toy: every rank keeps the whole model" not in toy.notes  # the CPU ranks' note, not the sim's
    assert (toy.peak_allocated_bytes, toy.param_bytes) == (alone.peak_allocated_bytes, alone.param_bytes)


def test_ddp_replays_one_device_plus_its_plans_buckets() -> None:
    """DDP's plan asks for the Reducer's buckets: one more gradient-sized set of bytes, alive from the load on."""
    ddp = sim.simulate(resolve("vit", "smoke", ["ddp"]))
    alone = sim.simulate(resolve("vit", "smoke", []))
    assert any(note.startswith("DDP rank (memclaims.sim.ddp)") for note in ddp.notes)
    assert ddp.load_peak_bytes - alone.load_peak_bytes >= alone.grad_bytes


def test_each_strategy_names_a_replay_found_by_its_path_and_a_wrong_path_is_one_line(monkeypatch) -> None:
    """Every registered strategy's ``sim_replay`` imports to a Replay of memclaims.sim.replays (no table of names to
    keep in step); a path that names no replay is a UsageError naming it, before anything runs."""
    import pytest

    from memclaims.core.errors import UsageError
    from memclaims.sim.replays import replay_of
    from memclaims.techniques import technique_registry as registry

    strategies = [name for name in registry.BY_NAME if registry.BY_NAME[name].distributed is not None]
    found = {type(replay_of(resolve("vit", "smoke", [name]))).__name__ for name in strategies}
    assert found == {"OneDeviceReplay", "ShardedReplay", "ZeroReplay", "TensorParallelReplay"}
    recipe = resolve("vit", "smoke", ["ddp"])
    strategy = recipe.distributed
    assert strategy is not None
    for path, said in (("memclaims.sim.replays.nope:Nope", "names no class that can be imported"),
                       ("memclaims.sim.replay:Session", "is not a Replay")):
        monkeypatch.setattr(type(strategy), "sim_replay", path)
        with pytest.raises(UsageError, match=said):
            replay_of(recipe)
