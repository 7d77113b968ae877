"""Deterministic accuracy on CUDA: the gpu tier's accuracy claims allow 2 points, so run to run the
same recipe must train the same way.

Set only for CUDA runs, and restored afterwards (except the environment variable, see below):
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8``: cuBLAS is deterministic only with one of the two documented
  workspace configurations. torch reads it once per process, when the first cuBLAS workspace is
  sized, so it is set before the first CUDA run and left set. It also fixes the workspace size the
  memory figures include: 2 x 32 MiB on every card (the sim profiles a100/h100/h200 model that).
- ``torch.use_deterministic_algorithms(True, warn_only=True)``: deterministic kernels where torch
  has them; where it has none (e.g. memory-efficient attention's backward) a warning, not an error.
- cuDNN deterministic, no autotuning (``benchmark``), which would pick kernels by timing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

CUBLAS_WORKSPACE_CONFIG = ":4096:8"


@contextmanager
def deterministic(device: str, *, torch_module: Any = None,
                  environ: MutableMapping[str, str] | None = None) -> Iterator[list[str]]:
    """Inside: deterministic settings for ``device == "cuda"`` (nothing otherwise). Yields notes
    for the Record saying what was set."""
    if device != "cuda":
        yield []
        return
    if torch_module is None:
        import torch as torch_module
    env = os.environ if environ is None else environ
    notes = []
    configured = env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    if configured not in (":4096:8", ":16:8"):
        notes.append(f"CUBLAS_WORKSPACE_CONFIG={configured} is not a deterministic setting (:4096:8 or :16:8)")
    cudnn = torch_module.backends.cudnn
    before = (torch_module.are_deterministic_algorithms_enabled(),
              torch_module.is_deterministic_algorithms_warn_only_enabled(), cudnn.deterministic, cudnn.benchmark)
    torch_module.use_deterministic_algorithms(True, warn_only=True)
    cudnn.deterministic, cudnn.benchmark = True, False
    notes.append(f"deterministic CUDA: CUBLAS_WORKSPACE_CONFIG={configured}, "
                 "use_deterministic_algorithms(True, warn_only=True), cudnn.deterministic")
    try:
        yield notes
    finally:
        torch_module.use_deterministic_algorithms(before[0], warn_only=before[1])
        cudnn.deterministic, cudnn.benchmark = before[2], before[3]
