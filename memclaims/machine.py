"""What this process has: CUDA devices, bitsandbytes stepping on a device, importable packages.

Apart from :mod:`memclaims.requirements` (what a case needs) because the optimizers ask the same
bitsandbytes question when they build, and the requirements ask the sim what it can replay, which
builds optimizers: one module for both would be an import cycle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from memclaims.errors import UsageError

DEVICES = ("cpu", "cuda")


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@cache
def bitsandbytes_problem(device: str = "cpu") -> str | None:
    """Why bitsandbytes' 8-bit optimizers cannot step on ``device`` here, or None when they can.

    One tiny Adam8bit step on a tensor at bitsandbytes' default 8-bit threshold (4096 elements),
    so the quantized path runs, not the fp32 fallback for small tensors. Cached per process and
    device: the runner calls it before any measured phase, so a case's bytes never include it.
    """
    if device not in DEVICES:
        raise UsageError(f"bitsandbytes runs on {', '.join(DEVICES)}, not {device!r}")
    if device == "cuda" and cuda_device_count() < 1:
        return "there is no CUDA device to step on"
    try:
        import bitsandbytes as bnb
    except Exception as error:  # ImportError, or a broken native library raising at import
        return f"bitsandbytes does not import: {type(error).__name__}: {error}"
    import torch

    try:
        probe = torch.nn.Parameter(torch.ones(4096, device=device))
        eight_bit: Any = bnb.optim  # untyped: its optimizers are looked up, not imported
        optimizer = eight_bit.Adam8bit([probe], lr=1e-3)
        probe.grad = torch.ones_like(probe)
        optimizer.step()
    except Exception as error:
        return (f"bitsandbytes {getattr(bnb, '__version__', '?')} has no working {device.upper()} backend for "
                f"8-bit optimizers: {type(error).__name__}: {error}")
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()  # the probe's blocks must not stay reserved in a GPU case
    return None


@cache
def package_problem(name: str) -> str | None:
    """Why ``name`` does not import here, or None. Importing, not finding: a package whose native
    part is broken is found and still fails."""
    try:
        importlib.import_module(name)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


class Machine:
    """What this process has. Each probe runs only when a need asks for it (the bitsandbytes step
    and a package import are not free); the module's functions are looked up at call time, so a
    test can replace one with monkeypatch."""

    def __init__(self, opted_in: Callable[[str], bool] = lambda name: False, cuda_devices: int | None = None) -> None:
        self.opted_in = opted_in
        self._cuda_devices = cuda_devices  # None: ask torch; a number: "a machine with N GPUs"

    def cuda_devices(self) -> int:
        return cuda_device_count() if self._cuda_devices is None else self._cuda_devices

    def bitsandbytes(self, device: str) -> str | None:
        return bitsandbytes_problem(device)

    def package(self, name: str) -> str | None:
        return package_problem(name)

    def has_path(self, path: str) -> bool:
        return Path(path).exists()
