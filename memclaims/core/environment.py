"""What decides a machine's numbers, and so which baseline file it compares with.

On the CPU the numbers depend on the kernels ATen dispatches to (its CPU capability class, which
``ATEN_CPU_CAPABILITY`` can lower), on the bf16/AMX instructions oneDNN finds on the processor
(it reads them itself, whatever ATen's class), and on how torch was built (a CUDA or a CPU-only
wheel links other math libraries). On CUDA they depend on the GPU model, CUDA and cuDNN. Library
versions are not part of the id: they live inside each Record, so an upgrade is a comparison
against the numbers measured before it, never a missing baseline.
"""

from __future__ import annotations

import platform
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memclaims.core.record import Record

# Instructions that change bf16/fp16 arithmetic when present (oneDNN uses them on its own).
_HALF_FEATURES = {"avx512_bf16": "bf16", "amx_bf16": "amx", "avx512_fp16": "fp16"}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_.]+", "-", text.lower()).strip("-") or "unknown"


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_capability() -> str:
    """ATen's kernel class in use (``avx2``, ``avx512``, ``default``...), after ATEN_CPU_CAPABILITY."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability()).lower()


def half_features() -> list[str]:
    flags = _cpu_flags()
    return sorted(short for flag, short in _HALF_FEATURES.items() if flag in flags)


def torch_build() -> str:
    """``cu130``, ``rocm6.2`` or ``cpu``: which math libraries the CPU kernels come with."""
    import torch

    if torch.version.cuda:
        return "cu" + torch.version.cuda.replace(".", "")
    if getattr(torch.version, "hip", None):
        return f"rocm{torch.version.hip}"
    return "cpu"


def cpu_class() -> str:
    """``avx2``, ``avx512-bf16-amx``: the capability and the half-precision instructions."""
    return "-".join([cpu_capability(), *half_features()])


def cpu_class_description() -> dict[str, object]:
    """The facts behind the id, stored in each CPU Record (``Record.environment``)."""
    return {"machine": platform.machine(), "capability": cpu_capability(),
            "half_features": half_features(), "torch_build": torch_build()}


def cuda_description() -> dict[str, object]:
    import torch

    return {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}


def describe(environment: dict[str, Any]) -> str:
    """One phrase for a message: ``avx512 with bf16, amx (cu130)``."""
    if "capability" in environment:
        features = environment.get("half_features") or []
        extra = f" with {', '.join(features)}" if features else ""
        return f"{environment['capability']}{extra} ({environment.get('torch_build', '?')})"
    if "gpu" in environment:
        return f"{environment['gpu']} (CUDA {environment.get('cuda')}, cuDNN {environment.get('cudnn')})"
    return "unrecorded"


def environment_id(record: Record, profile: str | None = None) -> str:
    """The class of machine a baseline belongs to: ``cpu-x86_64-avx2-cu130``,
    ``nvidia-h200-cuda13.0-cudnn91200``, ``sim-article`` (memclaims.core.environment says why)."""
    if record.device == "sim":
        # The sim profile decides the predicted numbers; the Record's probe names it ("sim:article").
        name = profile or record.probe.partition(":")[2] or "default"
        return f"sim-{slug(str(name))}"
    facts = record.environment
    if record.device == "cpu" and "capability" in facts:
        features = "".join(f"-{f}" for f in facts.get("half_features", []))
        return f"cpu-{slug(facts['machine'])}-{facts['capability']}{features}-{facts['torch_build']}"
    if record.device == "cuda" and "gpu" in facts:
        return f"{slug(facts['gpu'])}-cuda{facts['cuda']}-cudnn{facts['cudnn']}"
    return slug(record.device_name)  # a Record from before environments were recorded


def family(environment: str) -> str:
    """What siblings share: ``cpu-x86_64`` for every x86_64 CPU class, the GPU model for CUDA."""
    if environment.startswith("cpu-"):
        return "-".join(environment.split("-")[:2])
    return environment.split("-cuda")[0]
