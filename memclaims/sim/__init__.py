"""The `sim` device: predicted CUDA allocator peaks at article scale, on fake tensors, without a GPU.

Public API (what the CLI and the suite call):
- ``simulate(recipe, *, profile="article", memory_steps=None) -> Record``
- ``simulate_load(mode, *, profile="article", workload="vit", scale="article", num_classes=None,
  precision="16-true") -> LoadResult`` for the 07 model-load rows
- ``check(recipe)``: raises UsageError, with the reason, for a recipe the sim cannot replay
- ``PROFILES`` / ``profile(name)``: the simulated GPUs; ``LOAD_MODES``
"""

from memclaims.sim.profiles import PROFILES, Profile, profile
from memclaims.sim.replay import LOAD_MODES, LoadResult, PhaseResult, check, simulate, simulate_load

__all__ = ["LOAD_MODES", "PROFILES", "LoadResult", "PhaseResult", "Profile", "check", "profile", "simulate",
           "simulate_load"]
