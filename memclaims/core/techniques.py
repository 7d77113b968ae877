"""The technique registry: every memory-saving technique of the article, as data.

A technique only says what it changes in a recipe; the runner reads those fields. Cases,
combinations and the CLI are all generated from ``TECHNIQUES``, so adding a technique is adding
one entry here (and, if it changes something new, one field the runner reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import combinations

from memclaims.core.errors import UsageError

# Precision names are Lightning Fabric's own ``precision=`` strings.
FP32 = "32-true"
TRUE_HALF_PRECISIONS = ("16-true", "bf16-true")


@dataclass(frozen=True)
class Technique:
    name: str
    summary: str
    source: str  # the article script (row) it comes from
    group: str | None = None  # at most one technique per group in a recipe
    precision: str | None = None
    batch_divisor: int = 1
    accumulates: bool = False  # micro-batches of the scale's accumulation count
    optimizer: str | None = None
    init_on_device: bool = False
    plain_pytorch: bool = False
    alone: bool = False  # a whole recipe by itself; combines with nothing
    requires: frozenset[str] = field(default_factory=frozenset)  # capabilities, e.g. "bitsandbytes"
    needs: frozenset[str] = field(default_factory=frozenset)  # other techniques it builds on
    # Multi-device techniques (article 08-11, the LLM bonus): Lightning's ``strategy=`` name; a recipe
    # with a strategy runs on ranks through memclaims.measure.distributed. ``sharded``: FSDP's sharding.
    strategy: str | None = None
    sharded: bool = False
    # FSDP's ``ShardingStrategy`` name (torch.distributed.fsdp, Lightning's ``sharding_strategy=``) of a
    # sharded technique: FULL_SHARD for the article's fsdp; the others from issue #27 (``SHARDINGS``).
    sharding: str | None = None
    # Which FSDP a sharded technique is: FSDP1 (``FullyShardedDataParallel``: one FlatParameter per wrapped
    # unit; Lightning's FSDPStrategy) or FSDP2 (``fully_shard``: per-parameter dim-0 DTensor shards;
    # Lightning's ModelParallelStrategy). FSDP2's ``reshard_after_forward`` is its ``sharding``:
    # FULL_SHARD is True, SHARD_GRAD_OP is False (``reshard_after_forward``).
    fsdp2: bool = False
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    delayed_init: bool = False
    # Beyond the article (issue #27): saved activations to host memory, the optimizer step inside backward.
    offloads_activations: bool = False
    optimizer_in_backward: bool = False
    expandable_segments: bool = False  # the CUDA caching allocator's expandable_segments setting
    # The technique whose computation this one repeats exactly (the same kernels on the same data;
    # only where memory lives differs): the reference for an allocator setting, adamw8bit for its paged
    # variant. A recipe of such techniques alone trains no accuracy phase: its accuracy is the one of
    # the recipe with these in their place (memclaims.recipes.options.evaluates). None: its own numerics.
    computes_as: str | None = None
    # peft's LoRA adapters (issue #27): base weights frozen, only the adapters and the head trained.
    lora: bool = False
    # QLoRA: the base's linear layers stored in bitsandbytes 4-bit ("nf4"), frozen, under the adapters.
    quantize_base: str | None = None
    # The causal-LM loss from the last hidden states and the vocabulary projection's weight in one chunked
    # op (torch.nn.functional.linear_cross_entropy): the (tokens x vocabulary) logits never exist whole.
    fused_loss: bool = False
    # A technique only some workloads take: (the Workload attribute a workload sets to take it, why the
    # others cannot). memclaims.recipes.recipe refuses the rest with the reason; the tiers leave them out.
    workload_needs: tuple[str, str] | None = None
    # Techniques it does not combine with, each with the reason: (technique name, why not).
    conflicts: tuple[tuple[str, str], ...] = ()
    # Whether it joins the default selection's pairwise cover. The techniques added after the article's
    # do not: each would re-plan the greedy cover, renaming its combinations and orphaning their
    # baselines, and add fp32 ViT-L/16 cases past the nightly's 30 GPU-minutes (suite/unit/report/test_budget.py:
    # the two singles already take it from 26.7 to 29.4). Their pairs run in the full matrix.
    in_cover: bool = True
    # Whether its single case joins the default selection (the nightly). paged-adamw8bit does not: its
    # arithmetic is adamw8bit's, which the default runs, its memory effect is asserted by the sim tier
    # (claim paged-optimizer-unified-memory), and one more CUDA case would pass the nightly's 30
    # GPU-minutes (30.2 with it). Its cases run in the full matrix.
    in_default: bool = True


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


# The sharded techniques besides the article's fsdp (FULL_SHARD), by name: FSDP1's other sharding
# strategies, and FSDP2 (fully_shard) with reshard_after_forward on and off.
FSDP1_SHARDINGS = ("fsdp-shard-grad-op", "fsdp-no-shard", "fsdp-hybrid")
FSDP2_TECHNIQUES = ("fsdp2", "fsdp2-no-reshard")
FSDP_SHARDINGS = (*FSDP1_SHARDINGS, *FSDP2_TECHNIQUES)

# Why the optimizer step cannot move into backward alongside these (PyTorch's tutorial "How to save
# memory by fusing the optimizer step into the backward pass" names grad-accum and the strategies).
_IN_BACKWARD_CONFLICTS: tuple[tuple[str, str], ...] = (
    ("grad-accum", "the step runs on each backward's gradient as it is accumulated; accumulation needs the "
                   "gradients of all micro-batches summed before one step"),
    ("16-mixed", "GradScaler unscales the gradients and skips a step on inf/NaN after backward (scaler.step); "
                 "a step inside backward would apply the scaled gradients unchecked"),
    *((eight_bit, "memclaims builds one optimizer per parameter from the recipe's param groups, and "
                  "bitsandbytes keeps its 8-bit settings (min_8bit_size, optim_bits) outside them")
      for eight_bit in ("adam8bit", "adamw8bit", "paged-adamw8bit")),
    *((fsdp, "FSDP flattens the parameters into shards: hooks on the original parameters never fire, and a "
             "shard's gradient exists only after the reduce-scatter") for fsdp in ("fsdp", *FSDP1_SHARDINGS)),
    # memclaims' own: FSDP2 runs the sharded parameters' post-accumulate-grad hooks after each reduce-scatter
    # (torch's foreach_reduce), but memclaims' ranks engines step the optimizer after the backward only.
    *((fsdp2, "memclaims' multi-rank engines step the optimizer after the backward; FSDP2 would call the hook "
              "on each sharded parameter after its group's reduce-scatter, which memclaims does not replay")
      for fsdp2 in FSDP2_TECHNIQUES),
    ("ddp", "DDP all-reduces gradients in buckets from its own hooks; a step in the post-accumulate hook "
            "would apply the rank's local gradient before the all-reduce"),
    ("deepspeed-zero2", "DeepSpeed owns the optimizer step (partitioned fp32 master weights and states)"),
)
# A memclaims limitation, not torch's: the ranks' engines (memclaims.measure.distributed,
# memclaims.sim.sharded, memclaims.sim.zero) run their own forward passes without save_on_cpu.
_RANKS_DO_NOT_OFFLOAD = "the multi-rank engines of memclaims do not wrap their forward pass in save_on_cpu"
# Also memclaims' own: the adapters are put on the model in the one-device load (memclaims.measure.pipeline,
# memclaims.sim.replay); the ranks' engines build theirs without them.
_RANKS_DO_NOT_ADAPT = "memclaims applies the LoRA adapters in the one-device engines only; the multi-rank engines build the model without them"
_LORA_CONFLICTS: tuple[tuple[str, str], ...] = (
    *((s, _RANKS_DO_NOT_ADAPT) for s in ("fsdp", *FSDP_SHARDINGS, "ddp", "deepspeed-zero2")),
    ("optimizer-in-backward", "memclaims' in-backward step counts one step per parameter per backward; the frozen "
                              "base weights get no gradient, so their post-accumulate hooks never fire"),
)
# memclaims' own: it quantizes the base once, in fp32 compute, from the weights as built on the host.
_QLORA_CONFLICTS: tuple[tuple[str, str], ...] = (
    *((half, "Fabric's true-precision setup converts every floating parameter to the half dtype; memclaims "
             "quantizes the base in fp32 compute and does not set Linear4bit's compute dtype from the recipe")
      for half in TRUE_HALF_PRECISIONS),
    ("init-module", "memclaims quantizes the base from the fp32 weights as built; init_module would build them "
                    "on the device in the recipe's dtype first, which it does not replay"),
)
# The strategies shard or wrap the vocabulary projection; memclaims' fused loss reads its weight outside the
# model's forward, which FSDP frees (resharded) and the ranks' engines compute the loss from logits.
_FUSED_LOSS_CONFLICTS: tuple[tuple[str, str], ...] = (
    *((s, "memclaims computes the fused loss in the one-device engines only: it reads the vocabulary "
          "projection's weight after the forward, which FSDP has resharded, and the multi-rank engines compute "
          "the loss from logits") for s in ("fsdp", *FSDP_SHARDINGS, "ddp", "deepspeed-zero2")),
)
_FUSED_LOSS_WORKLOADS = ("fused_loss_head", "the fused linear + cross-entropy replaces a causal LM's vocabulary "
                         "projection and its loss (hf: workloads with the causal-lm head whose logits are the plain "
                         "projection, without soft-capping or scaling); this workload has none")
# Lightning's own (its connector): ModelParallelStrategy, which runs FSDP2 on CUDA, refuses this precision.
_MODEL_PARALLEL_16_MIXED = ("16-mixed", "Lightning's ModelParallelStrategy (FSDP2 on CUDA) refuses precision 16-mixed; "
                                        "it takes 32-true, bf16-mixed, bf16-true and 16-true")
_LORA_WORKLOADS = ("lora_targets", "peft's LoRA adapters go on the attention projections of the text workloads "
                   "(distilbert, distilbert-cased, bigbird: q_lin/v_lin, query/value) and of hf: models (peft's "
                   "default target modules for their model type); this workload names no modules to adapt")


TECHNIQUES: tuple[Technique, ...] = (
    Technique("pytorch", "plain PyTorch loop, fp32, Adam (no Fabric)", "01_pytorch-vit",
              group="loop", plain_pytorch=True, alone=True),
    Technique("fabric", "the same loop through Lightning Fabric, fp32: the reference recipe",
              "01-2_pytorch-fabric", group="loop", alone=True),
    Technique("16-mixed", "float16 automatic mixed precision", "02_mixed-precision",
              group="precision", precision="16-mixed"),
    Technique("bf16-mixed", "bfloat16 automatic mixed precision", "02_mixed-precision (bf16 variant)",
              group="precision", precision="bf16-mixed"),
    Technique("16-true", "parameters and activations in float16 (diverges to NaN in the article)",
              "02_mixed-precision (text: 16-true)", group="precision", precision="16-true"),
    Technique("bf16-true", "parameters and activations in bfloat16", "03_bfloat16",
              group="precision", precision="bf16-true"),
    Technique("small-batch", "batch size divided by 4 (64 -> 16 at article scale)",
              "04_lower-batchsize", batch_divisor=4),
    Technique("grad-accum", "gradient accumulation over the scale's micro-batches (4: a quarter of the "
              "batch each), same effective batch", "05_gradient-accum", accumulates=True),
    Technique("sgd", "SGD lr 0.01 without momentum + cosine schedule instead of Adam",
              "06_sgd-with-scheduler", group="optimizer", optimizer="sgd"),
    # The course's lesson "Mixed precision training with 8-bit Adam" (distilbert-base-cased).
    Technique("adamw", "AdamW, weight decay on all but LayerNorm weights and biases (the course's "
              "recipe)", "course: 8-bit Adam (AdamW)", group="optimizer", optimizer="adamw"),
    Technique("adam8bit", "bitsandbytes Adam8bit: both Adam states in 8 bits, block-wise quantized",
              "course: 8-bit Adam lesson", group="optimizer", optimizer="adam8bit",
              requires=frozenset({"bitsandbytes"})),
    Technique("adamw8bit", "bitsandbytes AdamW8bit: AdamW with 8-bit block-wise quantized states",
              "course: 8-bit Adam lesson", group="optimizer", optimizer="adamw8bit",
              requires=frozenset({"bitsandbytes"})),
    Technique("paged-adamw8bit", "bitsandbytes PagedAdamW8bit: AdamW8bit whose large states live in CUDA unified "
              "memory, paged to the host when the GPU runs out (on the CPU: unpaged, as bitsandbytes falls back)",
              "bitsandbytes docs: paged optimizers", group="optimizer", optimizer="paged_adamw8bit",
              requires=frozenset({"bitsandbytes"}), in_cover=False, in_default=False, computes_as="adamw8bit"),
    Technique("adafactor", "transformers Adafactor: factored second moment, no first moment",
              "course: 8-bit Adam (Adafactor)", group="optimizer", optimizer="adafactor"),
    Technique("init-module", "model built on the target device in the target precision "
              "inside Fabric's init_module", "07-03_init-module", init_on_device=True),
    # Multi-device, on top of the fp32 01-2 script; run by memclaims.measure.distributed (FSDP2 over gloo
    # on the CPU, Lightning's FSDPStrategy on CUDA).
    Technique("fsdp", "fully sharded data parallel, auto-wrapped on the transformer block",
              "08_fsdp-with-01-2", group="strategy", strategy="fsdp", sharded=True, sharding="FULL_SHARD"),
    # FSDP's other sharding strategies (issue #27), the same wrap as fsdp; outside the default selection's
    # cover. The article's CPU offload and delayed init (09, 11) build on FULL_SHARD only: they ``need`` fsdp.
    Technique("fsdp-shard-grad-op", "FSDP SHARD_GRAD_OP (ZeRO-2-like): gradients and optimizer state sharded, "
              "parameters all-gathered before the forward and kept unsharded until after the backward",
              "torch docs: ShardingStrategy.SHARD_GRAD_OP", group="strategy", strategy="fsdp", sharded=True,
              sharding="SHARD_GRAD_OP", in_cover=False),
    Technique("fsdp-no-shard", "FSDP NO_SHARD (DDP-like): parameters, gradients and optimizer state whole on "
              "every rank, gradients all-reduced", "torch docs: ShardingStrategy.NO_SHARD", group="strategy",
              strategy="fsdp", sharded=True, sharding="NO_SHARD", in_cover=False),
    Technique("fsdp-hybrid", f"FSDP HYBRID_SHARD over {HYBRID_NODES} simulated nodes: FULL_SHARD within each "
              f"1/{HYBRID_NODES} of the ranks, replicated across them (device mesh (replicate {HYBRID_NODES}, "
              f"shard N/{HYBRID_NODES}))", "torch docs: ShardingStrategy.HYBRID_SHARD", group="strategy",
              strategy="fsdp", sharded=True, sharding="HYBRID_SHARD", in_cover=False),
    # FSDP2 (issue #27): fully_shard on each block, then the root (Lightning's ModelParallelStrategy on CUDA,
    # the same calls over gloo on CPU ranks); outside the default selection (its sim and CPU-rank cases run in
    # CI and the nightly; on CUDA it needs several GPUs, which the nightly's single-GPU budget does not have).
    Technique("fsdp2", "FSDP2 fully_shard (reshard_after_forward=True): parameters sharded per parameter on "
              "dim 0, each block all-gathered before its forward and freed after it, re-all-gathered in "
              "backward", "torch docs: fully_shard (reshard_after_forward=True)", group="strategy",
              strategy="fsdp", sharded=True, sharding="FULL_SHARD", fsdp2=True, in_cover=False,
              conflicts=(_MODEL_PARALLEL_16_MIXED,)),
    Technique("fsdp2-no-reshard", "FSDP2 fully_shard (reshard_after_forward=False): the unsharded parameters "
              "kept from the forward through the backward (no all-gather in backward)",
              "torch docs: fully_shard (reshard_after_forward=False)", group="strategy", strategy="fsdp",
              sharded=True, sharding="SHARD_GRAD_OP", fsdp2=True, in_cover=False,
              conflicts=(_MODEL_PARALLEL_16_MIXED,)),
    # The LLM bonus "before" scripts: the whole model on every rank, gradients all-reduced in buckets
    # (Lightning's DDPStrategy passes no DDP options: torch's 25 MiB buckets, no bucket views).
    Technique("ddp", "distributed data parallel: the whole model, gradients and optimizer state on every "
              "rank, gradients all-reduced", "bonus_bigbird-before", group="strategy", strategy="ddp"),
    Technique("deepspeed-zero2", "DeepSpeed ZeRO stage 2 through Lightning's DeepSpeedStrategy: optimizer "
              "state, fp32 master weights and gradients partitioned over the ranks", "bonus_distilbert-before",
              group="strategy", strategy="deepspeed_stage_2", requires=frozenset({"deepspeed"})),
    # Needs no sharding: on one device each block is wrapped in torch.utils.checkpoint (hf: and
    # text models through their own gradient_checkpointing_enable()); with fsdp, Lightning's policy.
    Technique("activation-checkpointing", "recompute each transformer block's activations in backward",
              "08_fsdp-with-01-2", activation_checkpointing=True),
    # Offloading parameters to host memory only means something from a GPU.
    Technique("cpu-offload", "FSDP parameters offloaded to CPU memory, setup(move_to_device=False)",
              "09_fsdp-cpu-offload-with-01-2", cpu_offload=True, needs=frozenset({"fsdp"}),
              requires=frozenset({"cuda"})),
    Technique("delayed-init", "model built inside fabric.init_module(empty_init=False) under FSDP",
              "11_delay-allocation (logs only)", delayed_init=True, needs=frozenset({"fsdp"})),
    # torch.autograd.graph.save_on_cpu around the forward pass (pinned host memory where CUDA is).
    Technique("activation-offload", "tensors saved for backward moved to host memory during the forward pass "
              "(torch.autograd.graph.save_on_cpu), copied back in backward", "torch docs: save_on_cpu",
              offloads_activations=True, in_cover=False,
              conflicts=tuple((s, _RANKS_DO_NOT_OFFLOAD) for s in ("fsdp", *FSDP_SHARDINGS, "ddp", "deepspeed-zero2"))),
    # One optimizer per parameter, stepped and zeroed in Tensor.register_post_accumulate_grad_hook.
    Technique("optimizer-in-backward", "each parameter's optimizer step and zero_grad inside backward, as its "
              "gradient is ready: gradients freed as soon as they are applied",
              "torch tutorial: optimizer step in backward", optimizer_in_backward=True, in_cover=False,
              conflicts=_IN_BACKWARD_CONFLICTS),
    # A setting of the CUDA caching allocator: there is no caching allocator on the CPU; the sim
    # replays it (memclaims.sim.allocator).
    Technique("expandable-segments", "the CUDA caching allocator's expandable_segments:True: one segment per "
              "stream and pool that grows by mapping pages, instead of a segment per large request",
              "torch docs: CUDA semantics, expandable_segments", expandable_segments=True, in_cover=False,
              requires=frozenset({"cuda"}), computes_as="fabric"),
    # peft.get_peft_model(model, LoraConfig(r=8, lora_alpha=16, ...)) right after the model is built: the base
    # weights frozen, rank-8 adapters on the workload's attention projections, its head trained (modules_to_save).
    Technique("lora", "peft LoRA: base weights frozen, rank-8 adapters on the attention's query and value "
              "projections, the classification head trained", "peft docs: LoRA", group="adapter", lora=True,
              in_cover=False, conflicts=_LORA_CONFLICTS, workload_needs=_LORA_WORKLOADS),
    # QLoRA: each nn.Linear of the base (not the head) replaced by bitsandbytes' Linear4bit (NF4, fp32 compute)
    # before the same adapters go on; the sim refuses it (bitsandbytes quantizes from the weights' values).
    Technique("qlora", "QLoRA: the base's linear layers in bitsandbytes 4-bit NF4 (fp32 compute), frozen, under "
              "the lora technique's adapters", "peft docs: QLoRA (bitsandbytes 4-bit)", group="adapter", lora=True,
              quantize_base="nf4", in_cover=False, requires=frozenset({"bitsandbytes"}),
              conflicts=_LORA_CONFLICTS + _QLORA_CONFLICTS, workload_needs=_LORA_WORKLOADS),
    # torch.nn.functional.linear_cross_entropy(hidden, head.weight, targets, options=LinearCrossEntropyOptions()):
    # chunked over the tokens (memclaims.measure.fused_loss); in eval mode the head computes logits as before.
    Technique("fused-linear-ce", "the causal LM's vocabulary projection and cross-entropy fused and chunked over "
              "the tokens (torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions): the logits "
              "are never materialized whole", "torch docs: linear_cross_entropy", fused_loss=True, in_cover=False,
              requires=frozenset({"linear_cross_entropy"}), conflicts=_FUSED_LOSS_CONFLICTS,
              workload_needs=_FUSED_LOSS_WORKLOADS),
)

BY_NAME: dict[str, Technique] = {t.name: t for t in TECHNIQUES}
REFERENCE = "fabric"

# The article's cumulative single-GPU chain, 02 -> 06: each entry changes the previous by one thing
# (01-2, the REFERENCE, comes before it). The one table of the chain's recipes; each step's logged
# script and numbers are its row in memclaims/resources/published.json (``published.chain_row``).
ARTICLE_CHAIN: tuple[tuple[str, ...], ...] = (
    ("16-mixed",),
    ("bf16-true",),
    ("bf16-true", "small-batch"),
    ("bf16-true", "small-batch", "grad-accum"),
    ("bf16-true", "small-batch", "grad-accum", "sgd"),
)
# The article's table from its reference: 01-2 -> 06, the one definition every reader of the chain
# imports (the claims, the time model, gpu-check, reproduce, candidate, releases).
CHAIN: tuple[tuple[str, ...], ...] = ((REFERENCE,), *ARTICLE_CHAIN)


def technique(name: str) -> Technique:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UsageError(
            f"unknown technique {name!r}; valid techniques: {', '.join(BY_NAME)}"
        ) from None


def canonical(names: Iterable[str]) -> tuple[str, ...]:
    """Validate a set of technique names and return them in registry order.

    The empty set and ``("fabric",)`` both mean the reference recipe and canonicalise to
    ``("fabric",)`` so that a recipe has exactly one id.
    """
    chosen = [technique(n) for n in dict.fromkeys(names)]
    problem = violation(chosen)
    if problem:
        raise UsageError(f"invalid combination {'+'.join(t.name for t in chosen)}: {problem}")
    if not chosen:
        return (REFERENCE,)
    return tuple(t.name for t in TECHNIQUES if t in chosen)


def violation(chosen: list[Technique]) -> str | None:
    """The validity rule a combination breaks, or None when it is valid."""
    names = {t.name for t in chosen}
    for t in chosen:
        if t.alone and len(chosen) > 1:
            return f"{t.name!r} is a whole recipe by itself and combines with no other technique"
        missing = t.needs - names
        if missing:
            return f"{t.name!r} needs {', '.join(sorted(missing))}"
        for other, reason in t.conflicts:
            if other in names:
                return f"{t.name!r} does not combine with {other!r}: {reason}"
    groups: dict[str, list[str]] = {}
    for t in chosen:
        if t.group:
            groups.setdefault(t.group, []).append(t.name)
    for group, members in groups.items():
        if len(members) > 1:
            return f"at most one {group} technique per recipe (got {', '.join(members)})"
    return None


def single_process() -> tuple[Technique, ...]:
    """Techniques that run in one process; the multi-device ones have their own (dist) cases."""
    ranked = {t.name for t in TECHNIQUES if t.strategy}
    return tuple(t for t in TECHNIQUES if t.name not in ranked and not t.needs & ranked)


def _never_valid(chosen: list[Technique]) -> bool:
    """Whether ``chosen`` breaks a rule no further technique can mend (alone, a conflict, two of a group);
    ``needs`` can be met by adding the technique needed, so it is not one of them."""
    names = {t.name for t in chosen}
    groups = [t.group for t in chosen if t.group]
    return (len(groups) != len(set(groups)) or any(t.alone for t in chosen) and len(chosen) > 1
            or any(other in names for t in chosen for other, _ in t.conflicts))


def _valid_of_size(pool: tuple[Technique, ...], size: int, start: int,
                   chosen: list[Technique]) -> Iterator[tuple[str, ...]]:
    """The valid combinations of ``size`` that extend ``chosen`` with techniques from ``pool[start:]``, in
    ``itertools.combinations`` order; a prefix no technique can mend is not extended (the registry's 2^n
    subsets stay affordable as it grows)."""
    if len(chosen) == size:
        if violation(chosen) is None:
            yield tuple(t.name for t in chosen)
        return
    for index in range(start, len(pool) - (size - len(chosen)) + 1):
        extended = [*chosen, pool[index]]
        if not _never_valid(extended):
            yield from _valid_of_size(pool, size, index + 1, extended)


def valid_combinations(pool: tuple[Technique, ...] = TECHNIQUES) -> Iterator[tuple[str, ...]]:
    """Every valid non-empty combination of ``pool``, in a stable order (by size, then registry order)."""
    for size in range(1, len(pool) + 1):
        yield from _valid_of_size(pool, size, 0, [])


def compatible_pairs(pool: tuple[Technique, ...]) -> set[frozenset[str]]:
    return {
        frozenset(pair)
        for pair in combinations((t.name for t in pool), 2)
        if violation([BY_NAME[n] for n in pair]) is None
    }


def pairwise_cover(pool: tuple[Technique, ...]) -> list[tuple[str, ...]]:
    """A small set of valid combinations of ``pool`` in which every compatible pair appears at least once.

    Greedy set cover (largest number of still-uncovered pairs first, ties by the stable order of
    ``valid_combinations``); deterministic, so case ids never move between runs.
    """
    uncovered = compatible_pairs(pool)
    candidates = [c for c in valid_combinations(pool) if len(c) >= 2]
    cover: list[tuple[str, ...]] = []
    while uncovered:
        best = max(candidates, key=lambda c: len(uncovered & {frozenset(p) for p in combinations(c, 2)}))
        cover.append(best)
        uncovered -= {frozenset(p) for p in combinations(best, 2)}
    return cover


def singles(pool: tuple[Technique, ...] = TECHNIQUES) -> list[tuple[str, ...]]:
    """Each technique on its own, together with the techniques it needs (offload needs fsdp)."""
    return list(dict.fromkeys(canonical((t.name, *sorted(t.needs))) for t in pool))


def default_selection(pool: tuple[Technique, ...] | None = None) -> list[tuple[str, ...]]:
    """What the tiers run by default: every single technique ``in_default``, the article's chain, a
    pairwise cover of the techniques ``in_cover``."""
    pool = single_process() if pool is None else pool
    selected: dict[tuple[str, ...], None] = dict.fromkeys(singles(tuple(t for t in pool if t.in_default)))
    for step in ARTICLE_CHAIN:
        selected[canonical(step)] = None
    for combo in pairwise_cover(tuple(t for t in pool if t.in_cover)):
        selected[combo] = None
    return list(selected)


def full_matrix(pool: tuple[Technique, ...] | None = None) -> list[tuple[str, ...]]:
    pool = single_process() if pool is None else pool
    return [canonical(c) for c in valid_combinations(pool)]


# The named selections of technique combinations (pytest's --memclaims-matrix, ``memclaims
# benchmark --matrix``, ``memclaims list``'s case counts); memclaims.core.settings.Matrix names them
# for the options' table.
SELECTIONS: dict[str, Callable[[], list[tuple[str, ...]]]] = {
    "singles": lambda: singles(single_process()),
    "default": lambda: default_selection(),
    "full": lambda: full_matrix(),
}


def selection(name: str) -> list[tuple[str, ...]]:
    """The combinations the selection ``name`` runs (``SELECTIONS``)."""
    try:
        select = SELECTIONS[name]
    except KeyError:
        raise UsageError(f"unknown selection {name!r}; valid selections: {', '.join(SELECTIONS)}") from None
    return select()
