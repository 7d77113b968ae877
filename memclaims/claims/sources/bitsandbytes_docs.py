"""bitsandbytes' documentation (``memclaims/resources/sources/bitsandbytes-docs.json``): its paged optimizers."""

from __future__ import annotations

from memclaims.claims.check import Check, Verdict
from memclaims.claims.figures import in_mib
from memclaims.claims.lookup import Lookup, Techniques

DOCUMENT = "bitsandbytes-docs"

EIGHT_BIT_ADAMW: Techniques = ("adamw8bit",)
PAGED: Techniques = ("paged-adamw8bit",)
# The caching allocator's peak without the paged states, against their bytes: 0.99 at ViT-L/16 on the
# sim (0.600 GB lower for 0.606 GB paged); the band allows the order of the other allocations to move.
PAGED_SHARE = (0.9, 1.1)


def _paged_outside_allocator(tier: str, get: Lookup) -> Verdict:
    eight, paged = get(EIGHT_BIT_ADAMW), get(PAGED)
    moved = paged.observed(PAGED[0], "paged_state_bytes") or 0
    fall = eight.peak_allocated_bytes - paged.peak_allocated_bytes
    low, high = PAGED_SHARE
    return Verdict(moved > 0 and low * moved <= fall <= high * moved,
                   f"{in_mib(moved)} of optimizer state in unified memory; peak allocated {in_mib(eight.peak_allocated_bytes)} "
                   f"with AdamW8bit -> {in_mib(paged.peak_allocated_bytes)} paged: {in_mib(fall)} lower = "
                   f"{fall / moved if moved else float('nan'):.3f} of the paged bytes (band [{low:g}, {high:g}])")


CHECKS: dict[str, Check] = {
    "paged-optimizer-unified-memory": Check(_paged_outside_allocator, frozenset({"sim"}),
                                            {"*": (EIGHT_BIT_ADAMW, PAGED)}),
}
