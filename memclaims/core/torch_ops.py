"""Names of torch's operators that both a technique and a claim read (one fact, one place)."""

from __future__ import annotations

# The matmuls of torchtitan's "every second one is recomputed" (its rule counts aten.mm only; a linear layer with a
# bias runs addmm): the selective-checkpointing technique's policy and its claim's check.
MATMULS = frozenset({"aten.mm.default", "aten.addmm.default"})
