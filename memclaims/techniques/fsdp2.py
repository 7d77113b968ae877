"""fsdp2 and fsdp2-no-reshard (issue #27): FSDP2's ``fully_shard`` on each block, then the root (Lightning's
ModelParallelStrategy on CUDA, the same calls over gloo on CPU ranks), ``reshard_after_forward`` on and off.
Outside the default selection (its sim and CPU-rank cases run in CI and the nightly; on CUDA it needs several
GPUs, which the nightly's single-GPU budget does not have). Its strategy is fsdp's (``memclaims.techniques.fsdp``),
asked for FSDP2.
"""

from __future__ import annotations

from memclaims.techniques.base import FSDP2_API, Technique
from memclaims.techniques.fsdp import Fsdp

# Lightning's own (its connector): ModelParallelStrategy, which runs FSDP2 on CUDA, refuses this precision.
_MODEL_PARALLEL_16_MIXED = ("16-mixed", "Lightning's ModelParallelStrategy (FSDP2 on CUDA) refuses precision 16-mixed; "
                                        "it takes 32-true, bf16-mixed, bf16-true and 16-true")

ENTRY = Technique("fsdp2", "FSDP2 fully_shard (reshard_after_forward=True): parameters sharded per parameter on "
                  "dim 0, each block all-gathered before its forward and freed after it, re-all-gathered in "
                  "backward", "torch docs: fully_shard (reshard_after_forward=True)", group="strategy",
                  in_cover=False, conflicts=(_MODEL_PARALLEL_16_MIXED,), hooks=Fsdp("FULL_SHARD", FSDP2_API))
NO_RESHARD = Technique("fsdp2-no-reshard", "FSDP2 fully_shard (reshard_after_forward=False): the unsharded parameters "
                       "kept from the forward through the backward (no all-gather in backward)",
                       "torch docs: fully_shard (reshard_after_forward=False)", group="strategy", in_cover=False,
                       conflicts=(_MODEL_PARALLEL_16_MIXED,), hooks=Fsdp("SHARD_GRAD_OP", FSDP2_API))
ENTRIES = (ENTRY, NO_RESHARD)
