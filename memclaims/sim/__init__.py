"""The `sim` device: predicted CUDA allocator peaks at article scale, on fake tensors, without a GPU.

Callers run it through the one door, ``memclaims.run.run_recipe(recipe, RunOptions(device="sim", ...))``;
its entry points, for the door and the sim's own tests:
- ``simulate(recipe, *, profile="article", memory_steps=None, allocator_events=None, limit_bytes=None) -> Record``
- ``simulate_load_record(recipe, *, profile="article", ...) -> Record``: the load-only replay of the 07 scripts
  (``RunOptions(load_only=True)``); ``simulate_load(mode, *, profile="article", workload="vit",
  scale="article", num_classes=None, precision="16-true") -> LoadResult``, the same replay by load mode
- ``parameter_count(recipe)``: the parameters of the model the replay builds, counted on the meta device
- ``check(recipe)``: raises UsageError, with the reason, for a recipe the sim cannot replay
- ``PROFILES`` / ``profile(name)``: the simulated GPUs; ``LOAD_MODES``

May import ``core``, ``workloads``, ``techniques``, ``recipes`` and ``measure``.
"""

from memclaims.sim.profiles import PROFILES, Profile, profile
from memclaims.sim.replay import (
    LOAD_MODES,
    LoadResult,
    PhaseResult,
    check,
    load_mode,
    parameter_count,
    simulate,
    simulate_load,
    simulate_load_record,
)

__all__ = ["LOAD_MODES", "PROFILES", "LoadResult", "PhaseResult", "Profile", "check", "load_mode", "parameter_count",
           "profile", "simulate", "simulate_load", "simulate_load_record"]
