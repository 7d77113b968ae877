"""run_recipe() picks the engine: the sim for --device sim, the ranks for a sharded recipe or several
devices, Fabric on one device otherwise; every caller goes through it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from memclaims import sim
from memclaims.core.errors import OutOfMemory, UsageError
from memclaims.measure import distributed, runner
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import run_recipe, run_recipes, runs_ranks


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The real-device engines replaced by recorders of how they were called."""
    calls: list[tuple[str, Any]] = []

    def ranks(recipe: Any, options: RunOptions, devices: int | None = None, *, timeout_s: float | None = None) -> Any:
        calls.append(("ranks", (recipe.id, options.devices, timeout_s)))
        return SimpleNamespace(records=["rank0", "rank1"])

    def one(recipe: Any, options: RunOptions, probe: Any = None) -> str:
        calls.append(("one", recipe.id))
        return "record"

    monkeypatch.setattr(distributed, "run_distributed", ranks)
    monkeypatch.setattr(runner, "run", one)
    return calls


@pytest.mark.cpu
def test_a_sharded_recipe_runs_on_ranks(engines) -> None:
    recipe = resolve("vit", "smoke", ("fsdp",))
    assert run_recipe(recipe, RunOptions(devices=2, timeout_s=90.0)) == ["rank0", "rank1"]
    assert engines == [("ranks", (recipe.id, 2, 90.0))]


@pytest.mark.cpu
def test_several_devices_run_on_ranks_and_one_device_in_this_process(engines) -> None:
    fabric = resolve("vit", "smoke", ("fabric",))
    assert runs_ranks(fabric, RunOptions(devices=2)) and not runs_ranks(fabric, RunOptions())
    run_recipe(fabric, RunOptions(devices=2))
    assert run_recipe(fabric, RunOptions()) == ["record"]
    assert [kind for kind, _ in engines] == ["ranks", "one"]


@pytest.mark.sim
def test_the_sim_is_the_engine_of_device_sim(engines) -> None:
    recipe = resolve("vit", "smoke", ("fsdp", "bf16-true"))
    assert not runs_ranks(recipe, RunOptions(device="sim", devices=4))
    (record,) = run_recipe(recipe, RunOptions(device="sim", profile="h100", memory_steps=1))
    assert record.to_json() == sim.simulate(recipe, profile="h100", memory_steps=1).to_json()
    assert record.probe == "sim:h100" and engines == []


@pytest.mark.sim
def test_the_sims_options_reach_it_through_the_door_beside_the_records() -> None:
    """The allocator's history and its limit are asked for in RunOptions; the history comes back beside
    the Records (Measurement.allocator_events), the Record itself unchanged."""
    recipe = resolve("vit", "smoke", ("bf16-true",))
    events: list[Any] = []
    direct = sim.simulate(recipe, profile="h100", memory_steps=1, allocator_events=events)
    traced = run_recipe(recipe, RunOptions(device="sim", profile="h100", memory_steps=1, allocator_events=True))
    assert events and traced.allocator_events == events
    plain = run_recipe(recipe, RunOptions(device="sim", profile="h100", memory_steps=1))
    assert plain.allocator_events is None
    assert traced[0].to_json() == plain[0].to_json() == direct.to_json()
    limit = direct.peak_allocated_bytes - 2**20
    with pytest.raises(OutOfMemory) as starved:
        run_recipe(recipe, RunOptions(device="sim", profile="h100", memory_steps=1, limit_bytes=limit))
    assert starved.value.phase == "train" and f"allocator limited to {limit} B" in str(starved.value)


@pytest.mark.cpu
def test_a_real_device_refuses_the_sims_options(engines) -> None:
    recipe = resolve("vit", "smoke", ("fabric",))
    for asked in ({"limit_bytes": 2**30}, {"allocator_events": True}, {"load_only": True}):
        with pytest.raises(UsageError, match=f"{next(iter(asked))}: the sim's options"):
            run_recipe(recipe, RunOptions(device="cpu", **asked))
    assert engines == []


@pytest.mark.cpu
def test_measure_many_starts_the_ranks_once_for_every_sharded_recipe(engines, monkeypatch) -> None:
    groups: list[list[str]] = []

    def many(recipes: Any, options: RunOptions, devices: int | None = None, *, timeout_s: float | None = None) -> Any:
        groups.append([r.id for r in recipes])
        return [SimpleNamespace(records=[f"{r.id}@0", f"{r.id}@1"]) for r in recipes]

    monkeypatch.setattr(distributed, "run_distributed_many", many)
    fsdp, fabric, fsdp_ac = (resolve("vit", "smoke", t) for t in (("fsdp",), ("fabric",), ("fsdp", "activation-checkpointing")))
    assert run_recipes([fsdp, fabric, fsdp_ac], RunOptions()) == [
        [f"{fsdp.id}@0", f"{fsdp.id}@1"], ["record"], [f"{fsdp_ac.id}@0", f"{fsdp_ac.id}@1"]]
    assert groups == [[fsdp.id, fsdp_ac.id]] and engines == [("one", fabric.id)]


def test_host_state_counts_what_a_device_run_keeps_on_the_host_by_category() -> None:
    """CPU offload on a GPU run, faked: the parameters, their gradients and Adam's state are CPU
    tensors while the run's device is cuda; on the meta device (standing in for the GPU) nothing
    counts, and on the cpu device the host is the device."""
    import torch

    from memclaims.core.record import GRADIENTS, OPTIMIZER_STATE, PARAMETERS
    from memclaims.measure.pipeline import host_state_bytes

    model = torch.nn.Linear(8, 4)  # 32 + 4 fp32 parameters: 144 bytes
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    offloaded = SimpleNamespace(options=SimpleNamespace(device="cuda"), local=lambda t: t)
    state = host_state_bytes(offloaded, model, optimizer)  # type: ignore[arg-type]
    assert state[PARAMETERS] == state[GRADIENTS] == 144
    assert state[OPTIMIZER_STATE] == 2 * 144 + 2 * 4  # exp_avg, exp_avg_sq, and a step counter per tensor
    on_cpu = SimpleNamespace(options=SimpleNamespace(device="cpu"), local=lambda t: t)
    assert host_state_bytes(on_cpu, model, optimizer) == {}  # type: ignore[arg-type]
    on_device = torch.nn.Linear(8, 4, device="meta")
    assert host_state_bytes(offloaded, on_device, torch.optim.Adam(on_device.parameters())) == {}  # type: ignore[arg-type]
