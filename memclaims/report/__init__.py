"""What the commands print and write: reproduce, the ViT-H/14 and LLM series, fidelity, fit, the GPU
budget, upgrades (and the version matrix through them), the release history, the published table, calibration and
the measured noise.

May import everything below ``memclaims.run``, and ``run``, ``baselines`` and ``claims``; no pytest."""
