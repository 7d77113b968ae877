"""What the checks of more than one source read alike: the recipes and workloads whose one measured Record serves
claims of several sources (so a session measures it once)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memclaims.claims.lookup import Techniques

# Tensor parallelism (issue #43; the article's and Lightning's guide's claims): one rank of the tensor-parallel
# technique on the tier's default ranks (the sim's: 4), against the same recipe on one device. DistilBERT: its 12 heads
# split over 4 ranks; 66 M parameters replay in seconds at article scale.
TENSOR_PARALLEL: Techniques = ("tensor-parallel",)
TENSOR_PARALLEL_WORKLOAD = "distilbert"
# DistilBERT with the course's vocabulary: the model the course trains through its Trainer and its Accelerate loop
# (the course's claims and the stacks' docs').
STACK_WORKLOAD = "distilbert-cased"

