"""The precisions a recipe can ask for: one table that every engine reads (Fabric's own
``precision=`` strings as keys), so that a precision means the same on the CPU, a GPU and the sim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memclaims.errors import UsageError


@dataclass(frozen=True)
class Precision:
    name: str
    param_dtype: torch.dtype  # what the parameters are stored in
    compute_dtype: torch.dtype  # what the linear layers compute in (autocast's dtype when mixed)
    # What Lightning runs it as on the CPU: it has no float16 AMP there and runs 16-mixed as bf16.
    cpu_name: str

    @property
    def mixed(self) -> bool:
        return self.param_dtype != self.compute_dtype

    @property
    def true_half(self) -> bool:
        """Parameters and compute both in a half dtype (``16-true``, ``bf16-true``)."""
        return not self.mixed and self.param_dtype != torch.float32


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("32-true", torch.float32, torch.float32, "32-true"),
    Precision("16-mixed", torch.float32, torch.float16, "bf16-mixed"),
    Precision("bf16-mixed", torch.float32, torch.bfloat16, "bf16-mixed"),
    Precision("16-true", torch.float16, torch.float16, "16-true"),
    Precision("bf16-true", torch.bfloat16, torch.bfloat16, "bf16-true"),
)}


def precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise UsageError(f"unknown precision {name!r}; valid precisions: {', '.join(PRECISIONS)}") from None
