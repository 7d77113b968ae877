"""PyTorch's documentation (``memclaims/resources/sources/pytorch-docs.json``): the docstrings of save_on_cpu, the
caching allocator's expandable segments, FSDP's sharding strategies and FSDP2's reshard_after_forward, the fused
linear cross-entropy, torch.optim's three Adam implementations and selective activation checkpointing, on the
Records of the techniques that use them (what each observed: its ``by_technique`` part or the Record's fields)."""

from __future__ import annotations

import math

from memclaims.claims.check import Check, Verdict
from memclaims.claims.figures import MODEL_STATE, in_mib, model_state
from memclaims.claims.lookup import Lookup, Techniques
from memclaims.core.record import Record
from memclaims.core.torch_ops import MATMULS
from memclaims.techniques.base import FSDP2_API

DOCUMENT = "pytorch-docs"

OFFLOAD: Techniques = ("activation-offload",)
EXPANDABLE: Techniques = ("expandable-segments",)

# What leaves the device under save_on_cpu, against what it packed less the parameters (saved too, but
# they stay): 0.977 at ViT-L/16 on the sim; the rest is saved tensors that something else still holds.
OFFLOAD_SHARE = 0.90


def _saved_on_host(tier: str, get: Lookup) -> Verdict:
    plain, offload = get(("fabric",)), get(OFFLOAD)
    kept = plain.phases["forward"]["above_start_bytes"], offload.phases["forward"]["above_start_bytes"]
    left = kept[0] - kept[1]
    packed = offload.observed(OFFLOAD[0], "offloaded_activation_bytes") or 0
    activations = packed - offload.param_bytes
    return Verdict(activations > 0 and OFFLOAD_SHARE * activations <= left <= packed,
                   f"the forward pass keeps {in_mib(kept[0])} -> {in_mib(kept[1])} on the device under save_on_cpu: "
                   f"{in_mib(left)} left it, {left / activations if activations > 0 else float('nan'):.3f} of the "
                   f"{in_mib(packed)} packed to the host less the parameters' {in_mib(offload.param_bytes)} "
                   f"(at least {OFFLOAD_SHARE:g})")


def _fewer_slivers(tier: str, get: Lookup) -> Verdict:
    plain, grown = get(("fabric",)), get(EXPANDABLE)

    def unused(record: Record) -> int:
        return int(record.peak_reserved_total_bytes or 0) - record.peak_allocated_bytes

    return Verdict(unused(grown) < unused(plain) and (grown.peak_reserved_total_bytes or 0) <
                   (plain.peak_reserved_total_bytes or 0),
                   f"reserved but unused at the peak: {in_mib(unused(plain))} by default, {in_mib(unused(grown))} with "
                   f"expandable segments; peak reserved {in_mib(int(plain.peak_reserved_total_bytes or 0))} -> "
                   f"{in_mib(int(grown.peak_reserved_total_bytes or 0))}")


def _no_copy_on_cpu(tier: str, get: Lookup) -> Verdict:
    plain, offload = get(("fabric",)), get(OFFLOAD)
    peaks = {name: (entry["allocated_bytes"], offload.phases.get(name, {}).get("allocated_bytes"))
             for name, entry in plain.phases.items()}
    differ = {name: pair for name, pair in peaks.items() if pair[0] != pair[1]}
    packed = offload.observed(OFFLOAD[0], "offloaded_activation_bytes") or 0
    return Verdict(packed > 0 and not differ,
                   f"{packed:,} B of saved tensors went through save_on_cpu's pack hook; phases whose peak differs from "
                   f"the recipe without it: {differ or 'none'}")


# FSDP's sharding strategies, as torch.distributed.fsdp.ShardingStrategy's docstring describes them; the
# article's 08 recipe (fsdp + activation checkpointing) with each, rank 0 of the tier's ranks.
FULL_SHARD_08: Techniques = ("fsdp", "activation-checkpointing")
SHARD_GRAD_OP_08: Techniques = ("fsdp-shard-grad-op", "activation-checkpointing")
NO_SHARD_08: Techniques = ("fsdp-no-shard", "activation-checkpointing")


def _no_shard_replicates(tier: str, get: Lookup) -> Verdict:
    """NO_SHARD: a rank holds the whole model, its gradients and Adam state (2 x the parameters), the
    devices x FULL_SHARD rank's share of each."""
    full, whole = get(FULL_SHARD_08), get(NO_SHARD_08)
    model = whole.param_count * 4  # fp32, the 08 recipe
    expected = {"param_bytes": model, "grad_bytes": model, "optimizer_state_bytes": 2 * model}
    replicated = all(abs(getattr(whole, k) - v) <= 0.001 * v for k, v in expected.items())
    # Each sharded (FULL_SHARD) share is 1/devices of the whole, up to the flat parameters' padding.
    shares = {k: getattr(whole, k) / getattr(full, k) for k in MODEL_STATE if getattr(full, k)}
    sharded = len(shares) == 3 and all(abs(r - whole.devices) <= 0.01 * whole.devices for r in shares.values())
    return Verdict(replicated and sharded,
                   f"NO_SHARD rank {whole.rank} of {whole.devices}: {model_state(whole)} (the whole fp32 model "
                   f"{in_mib(model)}, Adam 2x: within 0.1 %); FULL_SHARD rank: {model_state(full)}; ratios "
                   + ", ".join(f"{k.removesuffix('_bytes')} {r:.3f}" for k, r in shares.items())
                   + f" (devices {whole.devices}, within 1 %)")


def _shard_grad_op_shards(tier: str, get: Lookup) -> Verdict:
    """SHARD_GRAD_OP: gradients and optimizer state sharded as FULL_SHARD's; parameters sharded outside the
    computation (the rank's shard, as FULL_SHARD's) but gathered inside it: every parameter still
    unsharded after the forward, so the rank's peak is above FULL_SHARD's."""
    full, zero2 = get(FULL_SHARD_08), get(SHARD_GRAD_OP_08)
    same_state = all(getattr(zero2, k) == getattr(full, k) for k in MODEL_STATE)
    gathered = zero2.forward_unsharded_params or 0
    inside = gathered >= zero2.param_count > (full.forward_unsharded_params or 0)
    above = zero2.peak_allocated_bytes > full.peak_allocated_bytes
    return Verdict(same_state and inside and above,
                   f"SHARD_GRAD_OP rank {zero2.rank} of {zero2.devices}: {model_state(zero2)}; FULL_SHARD's: {model_state(full)}; "
                   f"parameters gathered after the forward {gathered:,} of {zero2.param_count:,} (FULL_SHARD: "
                   f"{full.forward_unsharded_params}); peak allocated {in_mib(zero2.peak_allocated_bytes)} vs "
                   f"FULL_SHARD's {in_mib(full.peak_allocated_bytes)}")


# FSDP2's reshard_after_forward, as fully_shard's docstring describes it; the 08 recipe with fsdp2 (True) and
# fsdp2-no-reshard (False), rank 0 of the tier's ranks.
FSDP2_08: Techniques = ("fsdp2", "activation-checkpointing")
FSDP2_NO_RESHARD_08: Techniques = ("fsdp2-no-reshard", "activation-checkpointing")


def _fsdp2_keeps_unsharded(tier: str, get: Lookup) -> Verdict:
    """reshard_after_forward=False keeps the unsharded parameters in memory after the forward: every parameter
    still unsharded after it (True: the root's only, whose own default is False), the same shards as with
    True, and so a higher peak; both runs FSDP2's (``fsdp_api``). The all-gathers it avoids in backward are
    not counted: the claim is asserted on memory."""
    resharded, kept = get(FSDP2_08), get(FSDP2_NO_RESHARD_08)
    same_state = all(getattr(kept, k) == getattr(resharded, k) for k in MODEL_STATE)
    after = kept.forward_unsharded_params or 0
    kept_all = after >= kept.param_count > (resharded.forward_unsharded_params or 0)
    above = kept.peak_allocated_bytes > resharded.peak_allocated_bytes
    apis = (resharded.fsdp_api, kept.fsdp_api)
    return Verdict(same_state and kept_all and above and apis == (FSDP2_API, FSDP2_API),
                   f"reshard_after_forward=False rank {kept.rank} of {kept.devices} ({kept.fsdp_api}): {model_state(kept)}; "
                   f"True ({resharded.fsdp_api}): {model_state(resharded)}; parameters unsharded after the forward "
                   f"{after:,} of {kept.param_count:,} (True: {resharded.forward_unsharded_params}); peak allocated "
                   f"{in_mib(kept.peak_allocated_bytes)} vs {in_mib(resharded.peak_allocated_bytes)} with True")


FUSED_LOSS: Techniques = ("fused-linear-ce",)
# torch's LinearCrossEntropyOptions docstring: "the full ``(num_batches, num_classes)`` logits tensor is never
# materialized". Asserted on GPT-2 (hf:gpt2): the op ran in chunks of fewer rows than the tokens, and the
# recipe's peak allocated fell by at least one fp32 (tokens x vocabulary) logits tensor, what the reference
# keeps (Fabric's output cast) beside its gradient (measured: a fall of 2.3 such tensors on the cpu tier's
# smoke model, 3.2 at article scale on the sim).
FUSED_LOSS_WORKLOAD = "hf:gpt2"


def _logits_never_whole(tier: str, get: Lookup) -> Verdict:
    plain, fused = get(("fabric",)), get(FUSED_LOSS)
    rows, classes, chunk = (fused.observed(FUSED_LOSS[0], key) or 0 for key in
                            ("fused_loss_rows", "fused_loss_classes", "fused_loss_chunk_rows"))
    logits = 4 * rows * classes
    fall = plain.peak_allocated_bytes - fused.peak_allocated_bytes
    return Verdict(0 < chunk < rows and logits > 0 and fall >= logits,
                   f"{rows:,} tokens x {classes:,} classes in chunks of {chunk:,} rows; peak allocated "
                   f"{in_mib(plain.peak_allocated_bytes)} -> {in_mib(fused.peak_allocated_bytes)}: {in_mib(fall)} lower, "
                   f"{fall / logits if logits else float('nan'):.2f}x the fp32 logits' {in_mib(logits)} (at least 1x)")


# torch.optim's three implementations of Adam (memclaims.techniques.optimizer_impl), as the optimizer's docstrings in
# the installed torch describe them; each Record's by_technique part holds what its technique observed: the step
# temporaries of a step after the first (the optimizer_step phase's growth above its start: exact tensor bytes on
# the cpu tier and the sim), the largest parameter's bytes and each param group's. On the sim at smoke scale: the
# relation is the scale's own, and three ViT-L/16 replays would cost CI a minute.
FOR_LOOP: Techniques = ("for-loop",)
FOREACH: Techniques = ("foreach",)
FUSED_STEP: Techniques = ("fused",)
# The for-loop holds one parameter's intermediates at a time: its square root and the quotient computed from it,
# beside the previous parameter's denominator until the name is rebound (2x the largest parameter plus the one
# before it, measured: research Q4 and the cpu tier), so at most 3x the largest parameter.
FOR_LOOP_LARGEST = 3


def _temporaries(record: Record, implementation: str) -> tuple[int, int, int]:
    """(step temporaries, largest parameter, largest param group), in bytes, as the implementation observed them."""
    groups = record.observed(implementation, "group_parameter_bytes") or [0]
    return (int(record.observed(implementation, "step_temporary_bytes") or 0),
            int(record.observed(implementation, "largest_parameter_bytes") or 0), int(max(groups)))


def _foreach_sizeof_params_more(tier: str, get: Lookup) -> Verdict:
    loop, _, _ = _temporaries(get(FOR_LOOP), "for-loop")
    many, largest, params = _temporaries(get(FOREACH), "foreach")
    more = many - loop
    return Verdict(params > 0 and many >= params and loop <= FOR_LOOP_LARGEST * largest,
                   f"step temporaries: foreach {many:,} B ({many / params if params else math.nan:.2f}x the "
                   f"parameters' {params:,} B: a tensor list), the for-loop {loop:,} B "
                   f"({loop / largest if largest else math.nan:.2f}x the largest parameter's {largest:,} B, at most "
                   f"{FOR_LOOP_LARGEST}x); foreach holds {more:,} B more = "
                   f"{more / params if params else math.nan:.2f}x sizeof(params)")


def _fused_no_intermediates(tier: str, get: Lookup) -> Verdict:
    fused, largest, _ = _temporaries(get(FUSED_STEP), "fused")
    loop, many = _temporaries(get(FOR_LOOP), "for-loop")[0], _temporaries(get(FOREACH), "foreach")[0]
    return Verdict(largest > 0 and fused < largest and fused < loop and fused < many,
                   f"step temporaries: fused {fused:,} B, below the largest parameter's {largest:,} B (no "
                   f"parameter-sized intermediate), the for-loop's {loop:,} B and foreach's {many:,} B")


def _default_by_device(tier: str, get: Lookup) -> Verdict:
    """The reference recipe chooses no implementation: its optimizer step is the for-loop's on the CPU and
    foreach's on a (simulated) CUDA device, phase for phase."""
    expected = FOREACH if tier in ("sim", "gpu") else FOR_LOOP
    plain, chosen = get(("fabric",)), get(expected)
    keys = ("allocated_bytes", "above_start_bytes")
    default = [plain.phases.get("optimizer_step", {}).get(key) for key in keys]
    explicit = [chosen.phases.get("optimizer_step", {}).get(key) for key in keys]
    return Verdict(default[0] is not None and default == explicit,
                   f"phases.optimizer_step (allocated, above start) of the reference (no implementation chosen) "
                   f"{default} B, of {expected[0]} {explicit} B on the {tier} tier's device")


SELECTIVE: Techniques = ("selective-checkpointing",)
FULL_CHECKPOINTING: Techniques = ("activation-checkpointing",)


def _selective_between(tier: str, get: Lookup) -> Verdict:
    """torch's SAC docstring: a helper "to avoid recomputing certain ops during activation checkpointing". Asserted
    against the same recipe without checkpointing and with full checkpointing: the forward pass keeps less than
    without and more than with full checkpointing (the saved outputs), the peak lies between theirs, and the
    backward runs fewer ops again than the checkpointed forward ran (full checkpointing reruns them all), no
    matmul among them that the policy saved."""
    plain, full, selective = get(("fabric",)), get(FULL_CHECKPOINTING), get(SELECTIVE)
    kept = [record.phases.get("forward", {}).get("above_start_bytes", 0) for record in (plain, full, selective)]
    peaks = [record.peak_allocated_bytes for record in (plain, full, selective)]
    saved, marked, rerun = (selective.observed(SELECTIVE[0], key) or {}
                            for key in ("saved_ops", "recompute_ops", "recomputed_ops"))
    forward_ops, rerun_ops = sum(saved.values()) + sum(marked.values()), sum(rerun.values())
    matmuls = {key: (rerun.get(key, 0), saved.get(key, 0) + marked.get(key, 0)) for key in sorted(MATMULS)}
    matmuls_rerun = sum(again for again, _ in matmuls.values())
    matmuls_run = sum(ran for _, ran in matmuls.values())
    between = kept[1] < kept[2] < kept[0] and peaks[1] <= peaks[2] <= peaks[0]
    less = 0 < rerun_ops < forward_ops and matmuls_rerun <= sum(marked.get(key, 0) for key in MATMULS) < matmuls_run
    return Verdict(between and less,
                   f"the forward pass keeps {kept[0]:,} B without checkpointing, {kept[1]:,} B with full "
                   f"checkpointing, {kept[2]:,} B with SAC; peak allocated {peaks[0]:,} B, {peaks[1]:,} B, "
                   f"{peaks[2]:,} B; the backward ran {rerun_ops:,} of the checkpointed forward's {forward_ops:,} "
                   f"ops again (full checkpointing: all of them), {matmuls_rerun:,} of its {matmuls_run:,} matmuls "
                   f"(the policy saved {sum(saved.get(key, 0) for key in MATMULS):,})")


CHECKS: dict[str, Check] = {
    "activation-offload-saved-on-host": Check(_saved_on_host, frozenset({"sim"}), {"*": (("fabric",), OFFLOAD)}),
    "activation-offload-no-copy-on-cpu": Check(_no_copy_on_cpu, frozenset({"cpu"}), {"*": (("fabric",), OFFLOAD)}),
    "expandable-segments-fewer-slivers": Check(_fewer_slivers, frozenset({"sim"}), {"*": (("fabric",), EXPANDABLE)}),
    "fsdp-no-shard-replicates": Check(_no_shard_replicates, frozenset({"sim"}), {"*": (FULL_SHARD_08, NO_SHARD_08)}),
    "fsdp-shard-grad-op-shards-outside-computation": Check(_shard_grad_op_shards, frozenset({"sim"}),
                                                           {"*": (FULL_SHARD_08, SHARD_GRAD_OP_08)}),
    "fsdp2-no-reshard-keeps-unsharded": Check(_fsdp2_keeps_unsharded, frozenset({"sim"}),
                                              {"*": (FSDP2_08, FSDP2_NO_RESHARD_08)}),
    "fused-linear-ce-logits-never-whole": Check(_logits_never_whole, frozenset({"cpu", "sim"}),
                                                {"*": (("fabric",), FUSED_LOSS)}, workload=FUSED_LOSS_WORKLOAD),
    "optimizer-foreach-sizeof-params-more": Check(_foreach_sizeof_params_more, frozenset({"cpu", "sim"}),
                                                  {"*": (FOR_LOOP, FOREACH)}, scales={"sim": "smoke"}),
    "optimizer-fused-no-intermediates": Check(_fused_no_intermediates, frozenset({"cpu", "sim"}),
                                              {"*": (FUSED_STEP, FOR_LOOP, FOREACH)}, scales={"sim": "smoke"}),
    "optimizer-default-foreach-on-cuda": Check(_default_by_device, frozenset({"cpu", "sim"}),
                                               {"cpu": (("fabric",), FOR_LOOP), "sim": (("fabric",), FOREACH)},
                                               scales={"sim": "smoke"}),
    "selective-checkpointing-between-none-and-full": Check(_selective_between, frozenset({"cpu", "sim"}),
                                                           {"*": (("fabric",), FULL_CHECKPOINTING, SELECTIVE)}),
}
