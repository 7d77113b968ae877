"""PyTorch's tutorial on the optimizer step in backward (``memclaims/resources/sources/pytorch-tutorial.json``)."""

from __future__ import annotations

from memclaims.claims.check import Check, Verdict
from memclaims.claims.figures import in_mib
from memclaims.claims.lookup import Lookup, Techniques

DOCUMENT = "pytorch-tutorial"

IN_BACKWARD: Techniques = ("optimizer-in-backward",)
# The gradients' share the fused step saves: all of them at most (nothing else changes); at least 85 %,
# as the largest gradient still lives at its hook and the peak moves from the forward pass (where the
# previous step's gradients lived, the loop zeroing after it) to backward. Measured: 0.949 of them at
# vit-smoke on the cpu tier, 0.892 at ViT-L/16 on the sim.
IN_BACKWARD_SHARE = (0.85, 1.0)


def _gradients_saved(tier: str, get: Lookup) -> Verdict:
    plain, fused = get(("fabric",)), get(IN_BACKWARD)
    saved = plain.peak_allocated_bytes - fused.peak_allocated_bytes
    share = saved / plain.grad_bytes
    low, high = IN_BACKWARD_SHARE
    return Verdict(low <= share <= high and fused.grad_bytes == 0,
                   f"peak allocated {in_mib(plain.peak_allocated_bytes)} -> {in_mib(fused.peak_allocated_bytes)} with the step "
                   f"in backward: saved {in_mib(saved)} = {share:.3f} of the gradients' {in_mib(plain.grad_bytes)} "
                   f"(band [{low:g}, {high:g}]); gradients left after backward: {fused.grad_bytes} B")


CHECKS: dict[str, Check] = {
    "optimizer-in-backward-gradients": Check(_gradients_saved, frozenset({"cpu", "sim"}), {"*": (("fabric",), IN_BACKWARD)}),
}
