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
