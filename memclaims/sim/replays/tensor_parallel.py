"""One rank of a tensor-parallel recipe on the simulated GPU (the ``tensor-parallel`` technique), by per-rank
accounting on fake tensors: the model the replay builds, split as the real ranks split it.

The layout is the real ranks' own (``memclaims.techniques.impl.tensor_parallel_plan.layout``: which ``nn.Linear``
layers, column-wise or row-wise, and the head counts divided). Every rank holds the same shapes, so rank 0 is
replayed alone; each split layer keeps the rank's shard in place of its whole weight, where torch's styles put
it: ``ColwiseParallel`` shards the weight and the bias on dim 0 (``out_features / N`` rows of each),
``RowwiseParallel`` the weight on dim 1 (``in_features / N`` columns) and keeps the bias whole. The rest of the model
(embeddings, norms, the head, attention without a split, as the ViT's) is whole on the rank; the attention and the
MLP between the split layers run on the rank's own heads and features, so their activations are its share without
anything more to emulate (the models reshape with ``view(..., -1, head_dim)``).

Load (``load_split``), as ``TensorParallelize`` runs on a GPU: the model is built on the host, then
``parallelize_module`` takes each split layer in the layout's order: ``distribute_tensor`` moves the whole weight to
the device, splits it into one chunk per rank (contiguous copies when the split is on dim 1, views on dim 0),
scatters them into the rank's own shard and frees the rest; the bias likewise (a row-wise layer's whole bias stays).
Then the rest of the model moves to the device, as ``model.to(device)`` does.

The collectives, as DTensor allocates them, put on the split layers as the plan's own hooks are (``split``):

- forward, each row-wise layer: the local matmul gives a partial sum of the whole output; the plan's output hook
  redistributes it from ``Partial`` to ``Replicate`` through ``funcol.all_reduce``, which clones its input and
  reduces the clone in place: the partial output and the reduced copy coexist, then the partial is freed (no
  backward keeps it). Its backward passes the gradient through (a replicated gradient stays replicated);
- backward, each column-wise layer: the gradient of its replicated input is a partial sum, all-reduced the same
  way where the plan's input hook made the input a DTensor (``DTensor.from_local``'s backward): one all-reduce per
  column-wise layer (q, k and v each, the MLP's gate and up each), which autograd then sums; its forward allocates
  nothing (the input is replicated already).

Not modelled: NCCL's own buffers (outside the caching allocator, so not in ``max_memory_reserved``); DTensor's
bias-sized temporaries of a row-wise layer's bias (at most one bias per layer, hundreds of bytes to kilobytes).
With FSDP2 (2-D), ``memclaims.sim.sharded`` shards the rank's tensors over the data-parallel ranks afterwards, as
``fully_shard`` shards the DTensor shards (dim 0 of each local shard).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.core.precision import PRECISIONS
from memclaims.sim.replay import (
    PhaseResult,
    Replay,
    ReplayRequest,
    Session,
    SimPrecision,
    attention_context,
    default_dtype,
    model_counts,
    model_fns,
    move,
    opening,
    out_of_memory,
    tf32_matmul,
    train,
    trained_record,
)
from memclaims.techniques.base import FSDP2_API, ON_SIM, merge_observed, observations
from memclaims.techniques.impl.tensor_parallel_plan import (
    COLWISE,
    SPLIT_DIM,
    Layout,
    divide_heads,
    planned_linears,
)
from memclaims.techniques.impl.tensor_parallel_plan import (
    layout as find_layout,
)

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

# The sim's ranks when --devices is not given (the FSDP replay's default, the article's 4 GPUs).
SIM_DEFAULT_WORLD = 4


class _AllReduceOutput(torch.autograd.Function):
    """A row-wise layer's output hook: ``funcol.all_reduce`` of the partial sum (out of place: a clone, reduced in
    place); its gradient passes through."""

    @staticmethod
    def forward(ctx: object, partial: torch.Tensor) -> torch.Tensor:
        return partial.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _AllReduceInputGrad(torch.autograd.Function):
    """A column-wise layer's input hook: the input as it is; its gradient, a partial sum, all-reduced out of place."""

    @staticmethod
    def forward(ctx: object, replicated: torch.Tensor) -> torch.Tensor:
        return replicated.view_as(replicated)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad.clone()


@dataclass
class SplitModel:
    """What ``split`` did to a model: the split layers' whole and local elements, and what its first training
    forward showed (counted by the hooks, as ``ForwardWatch`` counts them on the real ranks)."""

    layout: Layout
    size: int
    whole_elements: int = 0
    colwise: int = 0
    linears: list[tuple[nn.Linear, str]] = field(default_factory=list)  # (layer, style), in the layout's order
    # The layers whose training forward ran on the rank's shard (each counted once, as on the first forward).
    colwise_local_outputs: set[int] = field(default_factory=set)
    rowwise_partial_outputs: set[int] = field(default_factory=set)

    def observed(self, data_parallel: int, fsdp2: bool) -> dict[str, object]:
        """The Record's ``by_technique["tensor-parallel"]``, with the real ranks' keys. With FSDP2 the rank's share
        of each split weight (and of its gradient) is FSDP2's dim-0 shard of its tensor-parallel shard (rank 0's:
        ``ceil(rows / data-parallel ranks)`` rows), as ``memclaims.sim.sharded`` holds it."""
        def share(weight: torch.Tensor) -> int:
            rows, rest = weight.shape[0], weight[0].numel()
            return -(-rows // data_parallel) * rest if fsdp2 else weight.numel()

        local = sum(share(linear.weight) for linear, _ in self.linears)
        grads = local if fsdp2 else sum(linear.weight.grad.numel() for linear, _ in self.linears
                                        if linear.weight.grad is not None)
        return {"tensor_parallel_size": self.size, "data_parallel_size": data_parallel,
                "split_linears": len(self.linears), "sharded_linears": len(self.linears),
                "split_weight_elements": self.whole_elements, "local_split_weight_elements": local,
                "local_split_grad_elements": grads, "colwise_linears": self.colwise,
                "forward_colwise_local_outputs": len(self.colwise_local_outputs),
                "forward_rowwise_partial_outputs": len(self.rowwise_partial_outputs)}


def _local_shape(tensor: torch.Tensor, style: str, size: int) -> list[int]:
    """A split weight's (or a column-wise bias's) shape on a rank: 1/N of its rows or columns."""
    shape = list(tensor.shape)
    shape[SPLIT_DIM[style] if tensor.dim() == 2 else 0] //= size
    return shape


def split(model: nn.Module, layout: Layout, size: int) -> SplitModel:
    """Rank 0's shards in place of each split layer's weight (and a column-wise layer's bias), on the host as the
    model was built; the collectives' hooks on the layers; the layout's head counts divided."""
    done = SplitModel(layout, size)
    for _, linear, style in planned_linears(model, layout):
        weight = linear.weight
        done.whole_elements += weight.numel()
        whole = weight.shape[SPLIT_DIM[style]]  # out_features (column-wise) or in_features (row-wise)
        linear.weight = nn.Parameter(weight.new_empty(_local_shape(weight, style, size)), weight.requires_grad)
        done.linears.append((linear, style))
        if style == COLWISE:
            done.colwise += 1
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias.new_empty(_local_shape(linear.bias, style, size)),
                                           linear.bias.requires_grad)
            linear.register_forward_pre_hook(_all_reduce_input_grad)
            linear.register_forward_hook(_count_colwise(done, whole))
        else:
            linear.register_forward_hook(_all_reduce_output(done, whole))
    divide_heads(model, layout, size)
    return done


def _all_reduce_input_grad(module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
    return (_AllReduceInputGrad.apply(args[0]), *args[1:])


def _count_colwise(done: SplitModel, out_features: int) -> Callable[..., None]:
    def hook(module: nn.Module, args: object, output: torch.Tensor) -> None:
        if module.training and output.shape[-1] * done.size == out_features:
            done.colwise_local_outputs.add(id(module))  # 1/N of the features: the shard's rows ran
    return hook


def _all_reduce_output(done: SplitModel, in_features: int) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        if module.training and args[0].shape[-1] * done.size == in_features:
            done.rowwise_partial_outputs.add(id(module))  # 1/N of the inputs: a partial sum, all-reduced here
        return cast(torch.Tensor, _AllReduceOutput.apply(output))
    return hook


def load_split(done: SplitModel) -> frozenset[int]:
    """The split layers' load on the device (inside the replay's counting), in the layout's order:
    ``distribute_tensor``'s whole copy on the device, its chunks (copies where the split is on dim 1) and the rank's
    shard, the whole and the chunks then freed (a replicated bias: the moved copy is the rank's). Returns the ids of
    the tensors now on the device; the replay moves the rest (``model.to(device)``)."""
    placed: set[int] = set()
    for linear, style in done.linears:
        for name in ("weight", "bias"):
            local = getattr(linear, name)
            if local is None:
                continue
            split_dim = SPLIT_DIM[style] if name == "weight" else (0 if style == COLWISE else None)
            if split_dim is not None:
                shape = list(local.shape)
                shape[split_dim] *= done.size
                whole = torch.empty(shape, dtype=local.dtype)  # distribute_tensor: tensor.to(device)
                chunks = [c.contiguous() for c in torch.chunk(whole, done.size, split_dim)]
                local.data = torch.empty_like(local)  # the scatter's output: the rank's shard
                del whole, chunks
            else:
                local.data = torch.empty_like(local)  # Replicate: the moved copy, broadcast in place
            placed.add(id(local))
    return frozenset(placed)


def replay(recipe: Recipe, request: ReplayRequest) -> Record:
    """Rank 0 of the recipe's tensor-parallel run (this module): the model built on the host as
    Lightning's ModelParallelStrategy gets it, its layout split to rank 0's shards and loaded as the parallelize_fn
    loads it, then the one-device loop on the rank's shards and collectives; with FSDP2 (2-D) memclaims.sim.sharded's
    FSDP2 over the data-parallel ranks on top, as fully_shard shards the tensor-parallel shards."""
    import memclaims.sim.sharded as sharded

    chosen, limit_bytes, allocator_events = request.profile, request.limit_bytes, request.allocator_events
    steps, notes = opening(recipe, request)
    strategy = recipe.distributed
    assert strategy is not None  # sim_replay "tensor-parallel" is a strategy's
    world = request.devices or SIM_DEFAULT_WORLD
    refused = strategy.rank_refusal(recipe, "sim", world)
    if refused:
        raise UsageError(refused)
    plan = recipe.strategy_plan(world)
    dp, tp = plan.mesh_size("data_parallel"), plan.mesh_size("tensor_parallel")
    fsdp2 = plan.fsdp_api == FSDP2_API
    if fsdp2 and allocator_events is not None:
        raise UsageError(f"{recipe.id}: the allocator history is recorded for one-device recipes and tensor "
                         "parallelism alone")
    build, inputs_fn = model_fns(recipe)
    notes.extend(plan.notes_on(ON_SIM))
    spec = PRECISIONS[recipe.precision]
    true_dtype = None if spec.mixed else spec.param_dtype
    session = Session(chosen, limit_bytes)
    session.memory.tf32_matmul = tf32_matmul(recipe)
    session.allocator.events = allocator_events
    phases: dict[str, PhaseResult] = {}
    torch.manual_seed(0)
    with out_of_memory(recipe, chosen, limit_bytes, phases), session.active():
        with session.phase(phases, "load"):
            with session.host(), default_dtype(true_dtype) if true_dtype else nullcontext():
                model = build(recipe.scale, recipe.workload.num_classes)  # Fabric converts true precisions on the host
            counts = model_counts(model)  # the whole model's, as the real ranks count
            found = find_layout(model, recipe.workload.block_class(), recipe.workload.tensor_parallel_plan)
            with session.host():
                done = split(model, found, tp)
            move(model, placed=load_split(done))  # then model.to(device): the rest
            if fsdp2:
                wrapped = sharded.wrap(model, recipe.workload.block_class(), session.memory, world=dp,
                                       shard_dtype=spec.param_dtype, param_dtype=spec.param_dtype,
                                       reduce_dtype=spec.param_dtype, offload=False, checkpointing=plan.checkpoint_blocks,
                                       auto_wrap=plan.wrap_blocks, moved=True, sharding=plan.sharding_strategy,
                                       fsdp2=True)
            elif plan.checkpoint_blocks:  # TensorParallelize's order: the split, then the model's own checkpointing
                from memclaims.techniques.impl import block_checkpointing as checkpointing

                notes.append(checkpointing.enable(model, recipe.workload))
        notes.append(found.note())
        if fsdp2:
            notes.append(f"FSDP2 over the {dp} data-parallel ranks (memclaims.sim.sharded): {sharded.FSDP2_NOTE}; "
                         f"reshard_after_forward={plan.reshard_after_forward} on each block, False on the root; in "
                         f"{spec.param_dtype} (no MixedPrecisionPolicy)")
            precision = SimPrecision(recipe)
            with session.phase(phases, "train"):
                states, _ = sharded.train(session, recipe, wrapped, steps, inputs_fn, precision,
                                          attention_context(chosen, precision.compute))
            del wrapped
        else:
            with session.phase(phases, "train"):
                states = train(session, recipe, model, steps, inputs_fn)
        name = next(n for n, hooks in zip(recipe.techniques, recipe.hooks) if hooks is strategy)
        merge_observed(states, observations(name, **done.observed(dp, fsdp2)))
        site = dict(session.memory.reserved_peak_site)
        del model, done
    return trained_record(recipe, session, site, steps=steps, model_counts=counts, notes=notes, states=states,
                          devices=world, rank=0)


class TensorParallelReplay(Replay):
    """This module's replay (a strategy names it by ``"memclaims.sim.replays.tensor_parallel:TensorParallelReplay"``)."""

    def run(self, recipe: Recipe, request: ReplayRequest) -> Record:
        return replay(recipe, request)
