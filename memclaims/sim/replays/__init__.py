"""The sim's replays, one module each, found by the name a strategy gives (``Strategy.sim_replay``), and the sim's
entry points that pick one: ``simulate``, ``simulate_load_record``, ``check``.

A replay is ``Replay(run, check)``: ``run(recipe, ReplayRequest) -> Record``, the Record built by the one tail every
replay shares (``memclaims.sim.replay.trained_record``); ``check`` refuses, before anything runs, a recipe the replay
cannot model. A new replay is its module here and one line of ``REPLAYS``; the strategy names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memclaims.core.errors import UsageError
from memclaims.core.precision import precision as precision_spec
from memclaims.sim.allocator import TraceEvent
from memclaims.sim.profiles import Profile
from memclaims.sim.profiles import profile as find_profile
from memclaims.sim.replay import (
    FAKE_DATA,
    PhaseResult,
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
from memclaims.sim.replays import one_device, sharded, tensor_parallel, zero

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

__all__ = ["FAKE_DATA", "REPLAYS", "Replay", "check", "simulate", "simulate_load_record"]


@dataclass(frozen=True)
class Replay:
    """One of the sim's replays of a training run: how it runs a recipe, and what it refuses before that."""

    run: Callable[[Recipe, ReplayRequest], Record]
    check: Callable[[Recipe], None] | None = None


# The replays by the name a strategy's ``sim_replay`` gives; a recipe without a strategy runs "one-device".
REPLAYS: dict[str, Replay] = {
    "one-device": Replay(one_device.replay),
    "sharded": Replay(sharded.replay, sharded.check),
    "zero": Replay(zero.replay),
    "tensor-parallel": Replay(tensor_parallel.replay),
}


def replay_of(recipe: Recipe) -> Replay:
    """The replay that runs ``recipe``: its strategy's (``Strategy.sim_replay``), else the one-device one."""
    strategy = recipe.distributed
    name = "one-device" if strategy is None else strategy.sim_replay
    try:
        return REPLAYS[name]
    except KeyError:
        raise UsageError(f"{recipe.id}: the sim has no replay {name!r}; its replays: {', '.join(REPLAYS)}") from None


def check(recipe: Recipe) -> None:
    """Raise UsageError, with the reason, for a recipe the sim cannot replay."""
    model_fns(recipe)
    chosen = replay_of(recipe)
    if chosen.check is not None:
        chosen.check(recipe)
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

    A recipe with a strategy is replayed as its strategy says (``Strategy.sim_replay``, a key of ``REPLAYS``): one
    rank of FSDP (``sharded``), of ZeRO-2 (``zero``), of tensor parallelism (``tensor-parallel``), or the one-device
    replay with the strategy's plan (DDP's buckets and notes)."""
    chosen = with_allocator_settings(find_profile(profile), recipe)
    check(recipe)
    request = ReplayRequest(chosen, memory_steps=memory_steps, allocator_events=allocator_events,
                            limit_bytes=limit_bytes, devices=devices)
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
