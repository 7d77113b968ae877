"""Lightning's documentation (``memclaims/resources/sources/lightning-docs.json``): its tensor parallelism guide, on
the Record of one rank of the tensor-parallel recipe the article's claim reads too (``memclaims.claims.shared_keys``)."""

from __future__ import annotations

from functools import partial

from memclaims.claims.check import Check, Verdict
from memclaims.claims.figures import ADAM_STEP_BYTES, MODEL_STATE, in_mib, model_state, peak, peak_metric
from memclaims.claims.lookup import Lookup
from memclaims.claims.shared_keys import TENSOR_PARALLEL, TENSOR_PARALLEL_WORKLOAD

DOCUMENT = "lightning-docs"

# What a rank's split layers weigh beyond their weights: the column-wise layers' bias shards (0.1 % of DistilBERT's
# split weights). Measured: the parameters fall by 1.0009x the split weights' (1 - 1/N).
TENSOR_PARALLEL_BIAS_SHARE = 1.01


def _holds_a_portion(tier: str, get: Lookup) -> Verdict:
    """Lightning's guide: each GPU holds only a portion of the weight matrix, which saves memory. The rank's
    parameters are the one-device run's less (1 - 1/N) of the split weights (and the column-wise biases' shards), its
    gradients less the same, Adam's two moments less twice that; and its peak is below the one device's."""
    one, rank = get(("fabric",)), get(TENSOR_PARALLEL)
    seen = partial(rank.observed, TENSOR_PARALLEL[0])  # what the technique observed on the rank, by key
    n = seen("tensor_parallel_size", 0)
    itemsize = one.param_bytes // max(1, one.param_count)
    split_fall = (seen("split_weight_elements", 0) - seen("local_split_weight_elements", 0)) * itemsize
    falls = {key: getattr(one, key) - getattr(rank, key) for key in MODEL_STATE}
    state = (split_fall > 0 and split_fall <= falls["param_bytes"] <= split_fall * TENSOR_PARALLEL_BIAS_SHARE
             and falls["grad_bytes"] == falls["param_bytes"]
             and abs(falls["optimizer_state_bytes"] - 2 * falls["param_bytes"]) <= ADAM_STEP_BYTES * one.param_tensor_count)
    lower = peak(rank) < peak(one)
    return Verdict(state and lower,
                   f"rank {rank.rank} of {rank.devices} (1/{n} of the split layers): {model_state(rank)}; one device: "
                   f"{model_state(one)}; the split weights' (1 - 1/{n}) is {in_mib(split_fall)}, parameters fell by "
                   f"{in_mib(falls['param_bytes'])} (at most {TENSOR_PARALLEL_BIAS_SHARE:g}x with the biases), gradients by "
                   f"{in_mib(falls['grad_bytes'])}, Adam state by {in_mib(falls['optimizer_state_bytes'])}; "
                   f"{peak_metric(rank)} {in_mib(peak(rank))} vs {in_mib(peak(one))} on one device")


CHECKS: dict[str, Check] = {
    "tensor-parallel-holds-a-portion": Check(_holds_a_portion, frozenset({"sim"}), {"*": (("fabric",), TENSOR_PARALLEL)},
                                             workload=TENSOR_PARALLEL_WORKLOAD),
}
