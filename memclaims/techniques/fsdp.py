"""fsdp and FSDP1's other sharding strategies (article 08; issue #27): Lightning's FSDPStrategy on CUDA ranks,
FSDP2's calls over gloo on CPU ranks (``memclaims.measure.distributed``), the sim's FSDP replay
(``memclaims.sim.sharded``). A strategy is an engine: the multi-rank engines read its entry (``strategy``,
``sharding``, ``fsdp2``) to run it; this module owns the entries, the sharding arithmetic every engine shares,
and the active check of what a rank holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.core.errors import UsageError
from memclaims.techniques.base import TRUE_HALF_PRECISIONS, Hooks, Say, Technique

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

# HYBRID_SHARD shards within a node and replicates across nodes; on one machine it is FULL_SHARD unless
# the ranks are split into nodes by a device mesh. memclaims splits them into this many "nodes" (a
# (replicate, shard) mesh of (HYBRID_NODES, N / HYBRID_NODES)) on every engine, so the technique differs
# from fsdp on one machine: a rank holds HYBRID_NODES / N of the model.
HYBRID_NODES = 2
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def shard_group_size(sharding: str | None, world: int) -> int:
    """How many ranks share one copy of the model, each holding a 1/size shard, under ``sharding``
    (None: FULL_SHARD) on ``world`` ranks: all of them, one (NO_SHARD), or one simulated node (HYBRID_SHARD)."""
    if sharding == "NO_SHARD":
        return 1
    if sharding == "HYBRID_SHARD":
        if world % HYBRID_NODES:
            raise UsageError(f"HYBRID_SHARD over {HYBRID_NODES} simulated nodes needs a number of ranks divisible "
                             f"by {HYBRID_NODES} (got {world})")
        return world // HYBRID_NODES
    return world


def reshard_after_forward(sharding: str | None) -> bool:
    """FSDP2's ``fully_shard(reshard_after_forward=...)`` for a sharded technique's ``sharding`` (None:
    FULL_SHARD): False for SHARD_GRAD_OP (the unsharded parameters stay from the forward through the
    backward), True otherwise."""
    return sharding != "SHARD_GRAD_OP"


# FSDP per rank: parameters, gradients and (Adam's) optimizer state are 1/G of the model's, G the ranks that
# share one copy (``shard_group_size``: N, 1 for NO_SHARD, one simulated node's for HYBRID_SHARD). Padding adds
# to it: FSDP2 pads each parameter's dim 0 to a multiple of G (the smoke ViT: +1.4 % over 2 ranks, +9.1 % over
# 4: 21,420 B for 19,626 B), FSDP1 each flat parameter by under G elements. 25 % covers the padding and stays
# far from the factor 2 between one strategy's share and the next's.
FSDP_SHARE_SLACK = 1.25


class Fsdp(Hooks):
    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """Is the recipe's FSDP sharding strategy the one that ran? What each strategy keeps per rank:
        FULL_SHARD and SHARD_GRAD_OP 1/N of the model state, NO_SHARD all of it, HYBRID_SHARD 1/(N/nodes);
        SHARD_GRAD_OP every parameter still gathered after the forward, the others (with a wrap policy) the
        root's only."""
        if record.devices == 1:
            return
        sharding, world = recipe.sharding or "FULL_SHARD", record.devices
        group = shard_group_size(sharding, world)
        whole = record.param_count * (2 if record.precision in TRUE_HALF_PRECISIONS else 4)
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
                say(f"rank {record.rank} holds {field_name} {held:,} B after {when}, not {what} {noun} "
                    f"({share:,.0f} B within {FSDP_SHARE_SLACK - 1:.0%}): {sharding} over {world} ranks "
                    f"shards them over {group}")
        if record.grad_bytes > whole / group * FSDP_SHARE_SLACK:
            say(f"rank {record.rank} holds grad_bytes {record.grad_bytes:,} B after phase backward, above {what} "
                f"gradients ({whole / group:,.0f} B): {sharding} over {world} ranks shards them over {group}")
        # FSDP2 (fsdp2, fsdp2-no-reshard): fully_shard must be what ran, wherever it runs (on CPU ranks every
        # FSDP technique runs it; the sim and CUDA run FSDP1 for the others).
        if recipe.fsdp2 and record.fsdp_api != "fsdp2":
            say(f"fsdp_api is {record.fsdp_api!r} after phase load, not 'fsdp2': FSDP2's fully_shard did not "
                "shard the model (FSDP1's flat parameters, or no FSDP, ran instead)")
        # The reshard setting, in the words of the API that runs it.
        kept, resharded = (("reshard_after_forward=False", "reshard_after_forward=True") if recipe.fsdp2 else
                           ("SHARD_GRAD_OP", sharding))
        gathered = record.forward_unsharded_params
        if gathered is None:
            if record.device != "cuda":  # Lightning's FSDPStrategy on CUDA ranks is not observed there
                say("forward_unsharded_params was not observed after phase forward")
            return
        if sharding == "SHARD_GRAD_OP" and gathered < record.param_count:
            say(f"forward_unsharded_params is {gathered:,} of {record.param_count:,} parameters after phase "
                f"forward: {kept} keeps every parameter gathered from the forward through the backward "
                "(the blocks were resharded after their forward, as FULL_SHARD does)")
        if sharding in ("FULL_SHARD", "HYBRID_SHARD") and recipe.workload.fsdp_auto_wrap and gathered >= record.param_count:
            say(f"forward_unsharded_params is {gathered:,} of {record.param_count:,} parameters after phase "
                f"forward: {resharded} reshards each wrapped block after its forward (only the root stays "
                "gathered)")


FSDP = Fsdp()

# Multi-device, on top of the fp32 01-2 script; run by memclaims.measure.distributed (FSDP2 over gloo
# on the CPU, Lightning's FSDPStrategy on CUDA).
ENTRY = Technique("fsdp", "fully sharded data parallel, auto-wrapped on the transformer block",
                  "08_fsdp-with-01-2", group="strategy", strategy="fsdp", sharded=True, sharding="FULL_SHARD",
                  hooks=FSDP)
# FSDP's other sharding strategies (issue #27), the same wrap as fsdp; outside the default selection's
# cover. The article's CPU offload and delayed init (09, 11) build on FULL_SHARD only: they ``need`` fsdp.
SHARD_GRAD_OP = Technique(
    "fsdp-shard-grad-op", "FSDP SHARD_GRAD_OP (ZeRO-2-like): gradients and optimizer state sharded, parameters "
    "all-gathered before the forward and kept unsharded until after the backward",
    "torch docs: ShardingStrategy.SHARD_GRAD_OP", group="strategy", strategy="fsdp", sharded=True,
    sharding="SHARD_GRAD_OP", in_cover=False, hooks=FSDP)
NO_SHARD = Technique(
    "fsdp-no-shard", "FSDP NO_SHARD (DDP-like): parameters, gradients and optimizer state whole on every rank, "
    "gradients all-reduced", "torch docs: ShardingStrategy.NO_SHARD", group="strategy", strategy="fsdp",
    sharded=True, sharding="NO_SHARD", in_cover=False, hooks=FSDP)
HYBRID = Technique(
    "fsdp-hybrid", f"FSDP HYBRID_SHARD over {HYBRID_NODES} simulated nodes: FULL_SHARD within each "
    f"1/{HYBRID_NODES} of the ranks, replicated across them (device mesh (replicate {HYBRID_NODES}, "
    f"shard N/{HYBRID_NODES}))", "torch docs: ShardingStrategy.HYBRID_SHARD", group="strategy",
    strategy="fsdp", sharded=True, sharding="HYBRID_SHARD", in_cover=False, hooks=FSDP)
ENTRIES = (ENTRY, SHARD_GRAD_OP, NO_SHARD, HYBRID)
