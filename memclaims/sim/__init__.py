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

The replays of a training run are one module each in ``replays/`` (one-device, sharded, zero, tensor-parallel), found
by the import path a strategy gives (``Strategy.sim_replay``, ``replays.replay_of``); ``replay.py`` holds what they share (the session on the allocator
model, the load, the training loop on fake tensors, the one Record tail).

May import ``core``, ``workloads``, ``techniques``, ``recipes`` and ``measure``.
"""

from memclaims.sim.profiles import PROFILES, Profile, profile
from memclaims.sim.replay import LOAD_MODES, LoadResult, PhaseResult, load_mode, parameter_count, simulate_load
from memclaims.sim.replays import check, simulate, simulate_load_record

__all__ = ["LOAD_MODES", "PROFILES", "LoadResult", "PhaseResult", "Profile", "check", "load_mode", "parameter_count",
           "profile", "simulate", "simulate_load", "simulate_load_record"]
