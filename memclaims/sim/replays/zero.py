"""DeepSpeed ZeRO stage 2 on one rank, by per-rank accounting (bonus_distilbert-before).

The script ran Lightning Fabric ``strategy="deepspeed_stage_2"``, ``precision="16-mixed"``, batch 12
per GPU, 4 GPUs (ARTICLE.md, LLM bonus). The sim has no DeepSpeed engine; what one rank holds at the
peak (the backward of a later step) is summed here, each term from the code that allocates it:

- ``fp16_model``: DeepSpeed's engine calls ``module.half()`` when fp16 is enabled, and
  ``DeepSpeedZeroOptimizer.__init__`` (``deepspeed/runtime/zero/stage_1_and_2.py``) flattens the
  whole group into ``bit16_groups_flat``, padded to ``nccl_start_alignment_factor (2) x world``
  elements: the whole fp16 model on every rank;
- ``fp32_master``: ``single_partition_of_fp32_groups``, this rank's ``1/world`` slice, ``.float()``;
- ``adam_states``: torch Adam's ``exp_avg`` and ``exp_avg_sq`` over that fp32 slice (its ``step`` is
  a host scalar: torch Adam is not ``capturable``);
- ``fp32_grad_partition``: the slice's fp32 gradient the step reads (``single_grad_partition``;
  during the backward DeepSpeed holds the same partition in fp16, ``grads_in_partition``: the fp32
  size is the larger of the two);
- ``reduce_buckets``: ``DeepSpeedZeroOptimizer.backward`` allocates, with ``contiguous_gradients``,
  an ``ipg_buffer`` of ``reduce_bucket_size`` elements in the model's dtype, and a second one with
  ``overlap_comm`` ("double buffers"), alive through the whole backward, whatever the model's size;
- ``activations``: the same recipe replayed on one simulated GPU (``DISTILBERT_ONE_GPU``), its
  peak reserved bytes less its own model states (parameters, gradients, optimizer state).

Lightning's ``DeepSpeedStrategy.__init__`` (``lightning/fabric/strategies/deepspeed.py``; the same
defaults in Fabric 2.0 of mid-2023 and in the installed 2.6): ``stage=2``, ``contiguous_gradients=True``,
``overlap_comm=True``, ``allgather_bucket_size=200_000_000``, ``reduce_bucket_size=200_000_000``
(elements). The all-gather after the step writes into ``bit16_groups_flat`` in place, in chunks of
``allgather_bucket_size``: no term.

What cannot be known without a GPU and DeepSpeed: NCCL's buffers and anything DeepSpeed ``cudaMalloc``s
outside the caching allocator (0 in ``max_memory_reserved``); how the caching allocator places the two
400 MB buckets among the activations' segments (the terms add allocations to one replay's reserved
bytes, not one replay of everything); the reduction stream's own free blocks (``overlap_comm`` reduces
on a side stream); the fp16 ``grads_in_partition`` coexisting with the fp32 partition at the step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch

from memclaims.core.errors import UsageError
from memclaims.core.precision import PRECISIONS
from memclaims.sim.profiles import profile as find_profile
from memclaims.sim.replay import Replay, ReplayRequest, check_techniques, model_fns, with_allocator_settings
from memclaims.sim.replays.one_device import replay as replay_one_device
from memclaims.techniques import technique_registry as registry

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

WORLD_SIZE = 4  # the article's LLM bonus: 4 GPUs
NCCL_START_ALIGNMENT_FACTOR = 2  # stage_1_and_2.py: "4-byte alignment/sizeof(fp16) = 2"


@dataclass(frozen=True)
class Zero2Config:
    """What the per-rank accounting reads of the strategy (Lightning's DeepSpeedStrategy defaults)."""

    world: int = WORLD_SIZE
    reduce_bucket_size: int = 200_000_000  # elements
    allgather_bucket_size: int = 200_000_000  # elements; in-place all-gather, no buffer of its own
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    model_dtype: torch.dtype = torch.float16  # DeepSpeed's fp16 (Lightning's "16-mixed")


LIGHTNING_DEFAULTS = Zero2Config()


@dataclass(frozen=True)
class Zero2Terms:
    """One rank's bytes at the peak, each term named as in the module docstring."""

    fp16_model: int
    fp32_master: int
    adam_states: int
    fp32_grad_partition: int
    reduce_buckets: int
    activations: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


def partition_numel(param_count: int, world: int) -> int:
    """This rank's slice of the flat group: padded to ``2 x world`` elements, then ``1/world``."""
    alignment = NCCL_START_ALIGNMENT_FACTOR * world
    return -(-param_count // alignment) * alignment // world


def zero2_rank_bytes(param_count: int, activations: int, config: Zero2Config = LIGHTNING_DEFAULTS) -> Zero2Terms:
    """Per-rank accounting of ZeRO-2 (one parameter group, fp16, torch Adam); ``activations`` from the sim."""
    part = partition_numel(param_count, config.world)
    half = config.model_dtype.itemsize
    fp32 = torch.float32.itemsize
    buckets = (1 + int(config.overlap_comm)) if config.contiguous_gradients else 0
    return Zero2Terms(
        fp16_model=part * config.world * half,
        fp32_master=part * fp32,
        adam_states=2 * part * fp32,
        fp32_grad_partition=part * fp32,
        reduce_buckets=buckets * config.reduce_bucket_size * half,
        activations=activations,
    )


# bonus_distilbert-before's one-GPU replay (workload, scale, techniques): 16-true, since under DeepSpeed the
# model is fp16 (``module.half()``) and Fabric's ``DeepSpeedPrecision.forward_context`` only sets the default
# dtype, no autocast, so the forward runs as the sim's 16-true does, not as its 16-mixed (autocast: fp32
# copies saved for backward). Its callers measure it through the one door (memclaims.run.run_recipe).
DISTILBERT_ONE_GPU = ("distilbert", "article", ("16-true",))


def single_gpu_activations(record: Record) -> tuple[int, int]:
    """(parameter count, activation and workspace bytes) of a one-GPU sim Record: its peak reserved
    bytes less its model states."""
    assert record.peak_reserved_total_bytes is not None  # the sim always predicts the reserved total
    states = record.param_bytes + record.grad_bytes + record.optimizer_state_bytes
    return record.param_count, record.peak_reserved_total_bytes - states


def predict_distilbert_before(one_gpu: Record) -> Zero2Terms:
    """bonus_distilbert-before: DistilBERT, ZeRO-2 x4, fp16, batch 12 of 512 tokens, rank 0, from the
    sim's Record of ``DISTILBERT_ONE_GPU``."""
    params, activations = single_gpu_activations(one_gpu)
    return zero2_rank_bytes(params, activations)


def check_replayable(recipe: Recipe) -> None:
    """The one-device replay's checks of ``recipe`` (its model, techniques, optimizer, precision)."""
    model_fns(recipe)
    check_techniques(recipe)


def replay(recipe: Recipe, request: ReplayRequest) -> Record:
    """Rank 0 of the recipe's DeepSpeed ZeRO-2 run (memclaims.sim.replays.zero): the same recipe replayed on one
    simulated GPU with the model in the half dtype (DeepSpeed's ``module.half()``/``bfloat16()``, no
    autocast), its activations added to ZeRO-2's per-rank model states."""
    from memclaims.recipes.recipe import resolve

    if request.allocator_events is not None or request.limit_bytes is not None:
        raise UsageError(f"{recipe.id}: DeepSpeed's rank is per-rank accounting: no allocator history or limit")
    half = "16-true" if recipe.precision == "16-mixed" else "bf16-true"
    rest = [t for t in recipe.techniques if registry.technique(t).distributed is None and t != recipe.precision]
    one = resolve(recipe.workload.name, recipe.scale.name, [half, *rest], recipe.sizes)
    check_replayable(one)  # the one-device replay's own checks, as the door's for that recipe
    one_gpu = replay_one_device(one, ReplayRequest(with_allocator_settings(find_profile(request.profile.name), one),
                                                   memory_steps=request.memory_steps))
    config = Zero2Config(model_dtype=PRECISIONS[half].param_dtype)
    terms = zero2_rank_bytes(*single_gpu_activations(one_gpu), config=config)
    notes = [*one_gpu.notes, f"DeepSpeed ZeRO-2 rank 0 of {config.world} by per-rank accounting (memclaims.sim.replays.zero): "
             f"{half} one-GPU replay's activations + model states by term {asdict(terms)}; peaks are "
             "the terms' sum (allocated = reserved: no allocator replay of the whole)"]
    return replace(
        one_gpu, **recipe.record_fields(), precision=recipe.precision, param_bytes=terms.fp16_model,
        grad_bytes=terms.fp32_grad_partition, optimizer_state_bytes=terms.fp32_master + terms.adam_states,
        peak_allocated_bytes=terms.total, peak_reserved_bytes=terms.total, peak_reserved_total_bytes=terms.total,
        phases={}, step_peaks={}, breakdown=asdict(terms), devices=config.world, rank=0, notes=notes)


class ZeroReplay(Replay):
    """This module's replay (a strategy names it by ``"memclaims.sim.replays.zero:ZeroReplay"``)."""

    def run(self, recipe: Recipe, request: ReplayRequest) -> Record:
        return replay(recipe, request)
