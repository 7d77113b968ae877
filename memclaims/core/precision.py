"""The precisions a recipe can ask for: one table that every engine reads (Fabric's own
``precision=`` strings as keys), so that a precision means the same on the CPU, a GPU and the sim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memclaims.core.errors import UsageError


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

    # What Fabric's precision plugin does around the forward, the one description every engine that
    # plays Fabric's part reads (the CPU ranks, memclaims.measure.distributed; the sim's replays);
    # Fabric on one device runs the plugin itself.
    def input_dtype(self, *, fsdp: bool = False) -> torch.dtype | None:
        """What the plugin casts a batch's floating tensors to (None: leaves them; integer token ids
        and masks are never cast). HalfPrecision and MixedPrecision (lightning/fabric/plugins/precision/
        half.py, amp.py) cast to the compute dtype; the installed Lightning's FSDPPrecision (fsdp.py,
        ``_desired_input_dtype``) casts a true-half recipe's but keeps a mixed one's in float32 (``fsdp``).
        The sim's FSDP replay reads the one-device rule: the 2023 Lightning's FSDPPrecision it models
        extended MixedPrecision."""
        if self.true_half or (self.mixed and not fsdp):
            return self.compute_dtype
        return None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The forward runs under autocast in this dtype (mixed precision), or without autocast (None)."""
        return self.compute_dtype if self.mixed else None

    @property
    def casts_output(self) -> bool:
        """``convert_output``: every plugin but 32-true's casts the forward's output (the logits) back
        to the default dtype, float32."""
        return self.mixed or self.true_half


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
