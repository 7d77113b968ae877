"""Is every technique of a recipe visibly at work in its Record?

A technique that silently does nothing (an 8-bit optimizer that keeps 32-bit state, a batch size
the loader ignores, an init_module that builds in fp32 anyway) leaves the memory numbers of a
smaller recipe looking plausible; only what the run observed tells. ``problems`` reads the
observed fields of a Record (memclaims.measure.loop and memclaims.measure.runner fill them) and names each
technique whose effect is missing. Every case that runs a recipe asserts it is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from memclaims.core.precision import PRECISIONS
from memclaims.core.record import Record
from memclaims.techniques.registry import shard_group_size, technique

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe

# What the linear layers compute in under each half precision, as the Record names dtypes.
HALF_DTYPE = {name: str(p.compute_dtype).removeprefix("torch.") for name, p in PRECISIONS.items()
              if p.compute_dtype != PRECISIONS["32-true"].compute_dtype}
TRUE_HALF = tuple(name for name, p in PRECISIONS.items() if p.true_half)


def problems(recipe: Recipe, record: Record, without: Mapping[str, Record] | None = None) -> list[str]:
    """One line per technique of ``recipe`` whose effect ``record`` does not show.

    ``without[name]``: the Record of the same recipe without technique ``name``, for the effects
    only a comparison shows (activation checkpointing lowers what the forward pass saves).
    """
    found: list[str] = []

    def say(technique: str, text: str) -> None:
        found.append(f"{record.recipe}: {technique} is not active: {text}")

    def saying(technique: str) -> Callable[[str], None]:
        return lambda text: say(technique, text)

    single = record.devices == 1
    _precision(recipe, record, single, say)
    _batch(recipe, record, say)
    names = set(recipe.techniques)
    if "sgd" in names and record.optimizer_state_bytes != 0:
        say("sgd", f"optimizer_state_bytes is {record.optimizer_state_bytes:,} B; plain SGD keeps no state")
    for name in names & {"adam8bit", "adamw8bit", "paged-adamw8bit"}:
        if record.device == "sim" and not record.optimizer_state_by_dtype:
            continue  # the sim computes 8-bit state sizes; it observes no dtypes
        quantized = record.optimizer_state_by_dtype.get("uint8", 0)
        if quantized == 0:
            say(name, f"no uint8 optimizer state (state bytes by dtype {record.optimizer_state_by_dtype}, "
                      f"min_8bit_size {record.min_8bit_size}): every state stayed 32-bit")
        elif single and record.optimizer_state_bytes > 4 * record.param_count:
            say(name, f"optimizer_state_bytes {record.optimizer_state_bytes:,} B is above 4 B per parameter "
                      f"({record.param_count:,} parameters); 8-bit Adam keeps about 2")
    for name, hooks in zip(recipe.techniques, recipe.hooks):  # each technique's own check (memclaims.techniques)
        hooks.check(recipe, record, (without or {}).get(name) if hooks.compare_without() else None, saying(name))
    if recipe.sharding is not None and record.devices > 1:
        _fsdp_sharding(recipe, record, say)
    if "ddp" in names and record.devices > 1:
        full = record.param_count * (2 if record.precision in TRUE_HALF else 4)
        if record.param_bytes != full:
            say("ddp", f"rank {record.rank} holds {record.param_bytes:,} B of parameters, not the whole "
                       f"model's {full:,} B: DDP replicates the model on every rank")
        if record.grad_digest is None:
            say("ddp", f"rank {record.rank} recorded no gradient digest: nothing shows an all-reduce")
    if "deepspeed-zero2" in names and record.devices > 1:
        _zero2_partitioned(record, say)
    return found


# ZeRO stage 2 per rank: the fp32 master copy and Adam's two fp32 states (12 B per parameter) and the
# fp32 gradient partition (4 B) are each 1/N of the model's; flat-buffer padding adds at most a few
# elements per rank, so 1 % above 1/N is already more than a partition holds.
ZERO2_STATE_BYTES_PER_PARAMETER = 12
ZERO2_GRAD_BYTES_PER_PARAMETER = 4
ZERO2_SLACK = 1.01


def _zero2_partitioned(record: Record, say: Callable[[str, str], None]) -> None:
    world = record.devices
    for field_name, per_parameter, what in (
            ("optimizer_state_bytes", ZERO2_STATE_BYTES_PER_PARAMETER, "fp32 master weights and Adam state"),
            ("grad_bytes", ZERO2_GRAD_BYTES_PER_PARAMETER, "fp32 gradient partition")):
        held = getattr(record, field_name)
        share = per_parameter * record.param_count / world
        if held > share * ZERO2_SLACK:
            say("deepspeed-zero2", f"rank {record.rank} holds {field_name} {held:,} B, above 1/{world} of the "
                                   f"model's {what} ({share:,.0f} B): ZeRO-2 partitions them over the ranks")


# FSDP per rank: parameters, gradients and (Adam's) optimizer state are 1/G of the model's, G the ranks that
# share one copy (memclaims.techniques.registry.shard_group_size: N, 1 for NO_SHARD, one simulated node's for
# HYBRID_SHARD). Padding adds to it: FSDP2 pads each parameter's dim 0 to a multiple of G (the smoke ViT:
# +1.4 % over 2 ranks, +9.1 % over 4: 21,420 B for 19,626 B), FSDP1 each flat parameter by under G elements.
# 25 % covers the padding and stays far from the factor 2 between one strategy's share and the next's.
FSDP_SHARE_SLACK = 1.25


def _fsdp_sharding(recipe: Recipe, record: Record, say: Callable[[str, str], None]) -> None:
    """Is the recipe's FSDP sharding strategy the one that ran? What each strategy keeps per rank:
    FULL_SHARD and SHARD_GRAD_OP 1/N of the model state, NO_SHARD all of it, HYBRID_SHARD 1/(N/nodes);
    SHARD_GRAD_OP every parameter still gathered after the forward, the others (with a wrap policy) the
    root's only."""
    name = next(t for t in recipe.techniques if technique(t).sharding)
    sharding, world = recipe.sharding or "FULL_SHARD", record.devices
    group = shard_group_size(sharding, world)
    whole = record.param_count * (2 if record.precision in TRUE_HALF else 4)
    on_device = not recipe.cpu_offload  # offload keeps the shards and their state on the host
    what = "the whole model's" if group == 1 else f"1/{group} of the model's"
    terms = [("param_bytes", 1, "model weights", "phase load (after setup)")]
    if recipe.optimizer in ("adam", "adamw"):
        terms.append(("optimizer_state_bytes", 2, "Adam state (two moments)", "phase optimizer_step"))
    for field_name, copies, noun, when in terms:
        held, share = getattr(record, field_name), copies * whole / group
        steps = 4 * record.param_tensor_count if field_name == "optimizer_state_bytes" else 0  # Adam's step scalars
        low = share / FSDP_SHARE_SLACK if on_device else 0
        if not low <= held <= share * FSDP_SHARE_SLACK + steps:
            say(name, f"rank {record.rank} holds {field_name} {held:,} B after {when}, not {what} {noun} "
                      f"({share:,.0f} B within {FSDP_SHARE_SLACK - 1:.0%}): {sharding} over {world} ranks "
                      f"shards them over {group}")
    if record.grad_bytes > whole / group * FSDP_SHARE_SLACK:
        say(name, f"rank {record.rank} holds grad_bytes {record.grad_bytes:,} B after phase backward, above {what} "
                  f"gradients ({whole / group:,.0f} B): {sharding} over {world} ranks shards them over {group}")
    # FSDP2 (fsdp2, fsdp2-no-reshard): fully_shard must be what ran, wherever it runs (on CPU ranks every
    # FSDP technique runs it; the sim and CUDA run FSDP1 for the others).
    if recipe.fsdp2 and record.fsdp_api != "fsdp2":
        say(name, f"fsdp_api is {record.fsdp_api!r} after phase load, not 'fsdp2': FSDP2's fully_shard did not "
                  "shard the model (FSDP1's flat parameters, or no FSDP, ran instead)")
    # The reshard setting, in the words of the API that runs it.
    kept, resharded = (("reshard_after_forward=False", "reshard_after_forward=True") if recipe.fsdp2 else
                       ("SHARD_GRAD_OP", sharding))
    gathered = record.forward_unsharded_params
    if gathered is None:
        if record.device != "cuda":  # Lightning's FSDPStrategy on CUDA ranks is not observed there
            say(name, "forward_unsharded_params was not observed after phase forward")
        return
    if sharding == "SHARD_GRAD_OP" and gathered < record.param_count:
        say(name, f"forward_unsharded_params is {gathered:,} of {record.param_count:,} parameters after phase "
                  f"forward: {kept} keeps every parameter gathered from the forward through the backward "
                  "(the blocks were resharded after their forward, as FULL_SHARD does)")
    if sharding in ("FULL_SHARD", "HYBRID_SHARD") and recipe.workload.fsdp_auto_wrap and gathered >= record.param_count:
        say(name, f"forward_unsharded_params is {gathered:,} of {record.param_count:,} parameters after phase "
                  f"forward: {resharded} reshards each wrapped block after its forward (only the root stays "
                  "gathered)")


def rank_problems(records: Sequence[Record]) -> list[str]:
    """What only the ranks of one run together show: DDP's gradients, all-reduced, are bit for bit
    the same on every rank after the backward (each rank's own batch gave different local ones)."""
    ddp = [r for r in records if "ddp" in r.techniques and r.devices > 1]
    digests = {r.rank: r.grad_digest for r in ddp}
    if len(set(digests.values())) > 1:
        return [f"{ddp[0].recipe}: ddp is not active: the ranks' gradients differ after the backward "
                f"(SHA-256 by rank: {digests}); DDP all-reduces them"]
    return []


def _precision(recipe: Recipe, record: Record, single: bool,
               say: Callable[[str, str], None]) -> None:
    ran = record.precision  # on the CPU Lightning runs 16-mixed as bf16-mixed; the Record says so
    if ran in TRUE_HALF:
        if single and record.param_bytes != 2 * record.param_count:
            say(recipe.precision, f"param_bytes {record.param_bytes:,} B is not 2 B x {record.param_count:,} "
                                  "parameters: the parameters are not half precision")
    elif record.quantized_parameter_bytes:  # qlora: 4-bit base weights among fp32 ones (their own check)
        floating = record.param_bytes - record.quantized_parameter_bytes
        if single and floating % 4:
            say(recipe.precision, f"param_bytes less the 4-bit weights' {record.quantized_parameter_bytes:,} B is "
                                  f"{floating:,} B, not a whole number of float32 parameters")
    elif single and record.param_bytes != 4 * record.param_count:
        say(recipe.precision, f"param_bytes {record.param_bytes:,} B is not 4 B x {record.param_count:,} "
                              "parameters: the parameters are not float32")
    if record.device == "sim" and not record.compute_dtypes:
        return  # the sim does not observe dtypes; its parameter bytes are checked above
    expected = HALF_DTYPE.get(ran, "float32")
    if record.compute_dtypes != [expected]:
        technique = ran if ran in HALF_DTYPE else "fp32 (no precision technique)"
        say(technique, f"the linear layers computed in {record.compute_dtypes or 'nothing observed'}, "
                       f"expected [{expected!r}]")


def _batch(recipe: Recipe, record: Record, say: Callable[[str, str], None]) -> None:
    if record.device == "sim" and record.step_examples is None:
        return  # the sim builds its inputs from the recipe; nothing to observe
    technique = "small-batch" if "small-batch" in recipe.techniques else "batch size"
    if record.step_examples != recipe.batch_size:
        say(technique, f"the last measured optimizer step consumed {record.step_examples} examples, "
                       f"expected the recipe's batch of {recipe.batch_size}")
    if record.step_micro_batches != recipe.accumulation_steps:
        technique = "grad-accum" if recipe.accumulation_steps > 1 else "optimizer step per batch"
        say(technique, f"the optimizer stepped after {record.step_micro_batches} micro-batches, "
                       f"expected {recipe.accumulation_steps}")
