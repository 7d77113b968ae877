"""The sim's replays of a training run, one module each (``one_device``, ``sharded``, ``zero``, ``tensor_parallel``),
and the sim's entry points that pick one: ``simulate``, ``simulate_load_record``, ``check``.

A strategy names its replay by import path (``Strategy.sim_replay``, ``"memclaims.sim.replays.zero:ZeroReplay"``), as a
stack names its driver: found by ``replay_of`` (``memclaims.core.targets``), imported when a recipe runs on it, no
table of names here. A replay is a ``memclaims.sim.replay.Replay``: ``run(recipe, ReplayRequest) -> Record``, built by
the one Record tail every replay shares (``memclaims.sim.replay.trained_record``), and ``check``, what it refuses
before anything runs. A recipe without a strategy runs the one-device replay. A new replay is its module here and
the string its strategy's module gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.core.errors import UsageError
from memclaims.core.precision import precision as precision_spec
from memclaims.core.targets import target_class
from memclaims.sim.allocator import TraceEvent
from memclaims.sim.library_eras import replaying
from memclaims.sim.profiles import Profile
from memclaims.sim.profiles import profile as find_profile
from memclaims.sim.replay import (
    FAKE_DATA,
    PhaseResult,
    Replay,
    ReplayRequest,
    Session,
    check_techniques,
    limit_notes,
    load_mode,
    model_fns,
    out_of_memory,
    replay_load,
    sim_record,
    with_allocator_settings,
)
from memclaims.sim.replays.one_device import OneDeviceReplay

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

__all__ = ["FAKE_DATA", "Replay", "check", "replay_of", "simulate", "simulate_load_record"]


def replay_of(recipe: Recipe) -> Replay:
    """The replay that runs ``recipe``: its strategy's (``Strategy.sim_replay``), else the one-device one."""
    strategy = recipe.distributed
    if strategy is None:
        return OneDeviceReplay()
    return target_class(strategy.sim_replay, Replay)()


def check(recipe: Recipe) -> None:
    """Raise UsageError, with the reason, for a recipe the sim cannot replay."""
    model_fns(recipe)
    replay_of(recipe).check(recipe)
    check_techniques(recipe)


def simulate(recipe: Recipe, *, profile: str = "article", memory_steps: int | None = None,
             allocator_events: list[TraceEvent] | None = None, limit_bytes: int | None = None,
             devices: int | None = None) -> Record:
    """Predict the CUDA caching allocator's peaks for ``recipe`` on the profile's GPU.

    ``allocator_events``, a list, receives the allocator model's history in the terms of torch's
    (``memclaims.gpu.alloc_trace``); one-device recipes only. ``limit_bytes``: what the allocator
    can get from the device (a card's memory less the CUDA context); past it the model frees its
    cache and retries as torch does, and raises OutOfMemory where torch would. None: unlimited.
    ``devices``: the ranks of a sharded recipe (rank 0 is replayed); None: the replay's own default.

    A recipe with a strategy is replayed as its strategy says (``Strategy.sim_replay``, the import path of its replay): one
    rank of FSDP (``sharded``), of ZeRO-2 (``zero``), of tensor parallelism (``tensor_parallel``), or the one-device
    replay with the strategy's plan (DDP's buckets and notes)."""
    chosen = with_allocator_settings(find_profile(profile), recipe)
    check(recipe)
    request = ReplayRequest(chosen, memory_steps=memory_steps, allocator_events=allocator_events,
                            limit_bytes=limit_bytes, devices=devices)
    with replaying(chosen.library_eras):  # older libraries' allocations, where the profile names eras
        return replay_of(recipe).run(recipe, request)


def simulate_load_record(recipe: Recipe, *, profile: str = "article", allocator_events: list[TraceEvent] | None = None,
                         limit_bytes: int | None = None) -> Record:
    """``simulate_load`` of the recipe's load (``load_mode``, its precision, workload and scale) as a Record:
    the load phase only (memory_steps 0, no gradients or optimizer state), the stock head as the 07
    scripts load it (1000 classes for ``vit_l_16``). The door's ``RunOptions(load_only=True)``."""
    chosen = with_allocator_settings(find_profile(profile), recipe)
    check(recipe)
    strategy = recipe.distributed
    if strategy is not None and strategy.shards_parameters:
        raise UsageError(f"{recipe.id}: the load-only replay (the 07 scripts) loads on one device; "
                         "a sharded recipe's load runs with its training")
    mode = load_mode(recipe)

    def session_of(chosen: Profile) -> Session:
        session = Session(chosen, limit_bytes)
        session.allocator.events = allocator_events
        return session

    phases: dict[str, PhaseResult] = {}
    with out_of_memory(recipe, chosen, limit_bytes, phases):
        result, session, tensors = replay_load(mode, chosen, recipe.workload.name, recipe.scale, None,
                                                recipe.precision, session_of)
    how = ('built inside fabric.init_module()' if mode == "init-module"
           else f'built on the CPU in fp32, then .to("cuda").to({precision_spec(recipe.precision).param_dtype})')
    notes = [f"sim profile {chosen.name!r}: {chosen.summary}",
             f"load only ({mode}, as the 07 scripts load the model): the stock head, {how}; no training step"]
    notes.extend(limit_notes(session))
    return sim_record(recipe, session, memory_steps=0, param_count=result.param_count, param_tensor_count=tensors,
                      notes=notes, observed={"param_bytes": result.param_bytes, "grad_bytes": 0,
                                             "optimizer_state_bytes": 0})
