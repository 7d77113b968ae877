"""The lent GPU: the prepared check (``scripts/gpu-check``), the gpu tier's preflight on the sim, and
the replay of a GPU's allocator history through the sim's allocator model.

May import everything below ``memclaims.run``, and ``run``, ``baselines``, ``claims`` and ``report``."""
