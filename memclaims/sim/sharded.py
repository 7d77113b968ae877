"""Sharded recipes on the simulated GPU: one rank of FSDP1 as Lightning's FSDPStrategy ran it.

The article's 08/09/11 scripts and the ViT-H/14 series use ``FSDPStrategy`` (FSDP1: one
``FlatParameter`` per wrapped unit, ``use_orig_params=True``), 4 ranks, auto-wrap on the
transformer block, optionally activation checkpointing on the block (non-reentrant, inside the
FSDP unit) and ``CPUOffload(offload_params=True)``. No process group is needed to know what one
rank holds: every rank holds the same shapes, so this replays rank 0 alone on fake tensors, with
FSDP1's allocations emulated around the real model's forward and backward (per-rank accounting):

- units: one per transformer block, and the root (every parameter outside the blocks). Each
  unit's flat parameter is padded to a multiple of the world size; a rank keeps ``1/W`` of it
  (the shard) in the original dtype, on the device unless offloaded;
- forward: each unit all-gathers its full flat parameter (in ``MixedPrecision.param_dtype``, read
  from the installed Lightning's ``FSDPPrecision``) before its forward and frees it after, except
  the root, which FSDP1 keeps unsharded until the end of backward. With offload, the shard is first
  copied to the device (a shard-sized temporary);
- backward: a unit's pre-backward all-gathers it again and prefetches the next unit
  (``BackwardPrefetch.BACKWARD_PRE``, the default), so two blocks are unsharded at once; the
  original parameters' gradients are views of one flat gradient, concatenated when the last
  arrives (``SplitWithSizesBackward``: the per-parameter gradients and the flat one coexist
  briefly); the reduce-scatter writes a shard-sized gradient (cast to the reduce dtype first
  when it differs) and the full one is freed; with offload the sharded gradient goes to the host;
- the optimizer steps over the shards (Adam state ``2/W`` of the model), on the host with offload;
- streams: all-gathers run on FSDP's unshard stream and reduce-scatters on its post-backward
  stream; the allocator keeps free blocks per stream, which is what makes FSDP reserve more than
  it allocates.

Not predicted, and bounded in ``UNMODELLED``: NCCL's own buffers (outside the caching allocator,
so outside ``max_memory_reserved``: 0 by construction), the cross-stream frees that the real
allocator delays until the stream's work completes (``record_stream``: at most one more unsharded
unit and one more flat gradient per stream, which the bound below states), and the evaluation loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memclaims import optimizers
from memclaims.errors import UsageError
from memclaims.probes import optimizer_state_tensors
from memclaims.recipe import Recipe
from memclaims.sim.tracker import DeviceMemory

WORLD_SIZE = 4  # the article's multi-GPU runs and the ViT-H/14 series: 4 GPUs
DEFAULT_STREAM, UNSHARD_STREAM, POST_BACKWARD_STREAM = 0, 1, 2

UNMODELLED = {
    "nccl": "NCCL's communication buffers are cudaMalloc'd outside the caching allocator: not in "
            "max_memory_reserved, so 0 by construction",
    "record_stream": "frees across streams wait for the stream's work in the real allocator; the replay "
                     "frees at once. Bound: at most one more unsharded unit and one more flat gradient "
                     "alive (2 x the largest unit's bytes)",
    "evaluation": "the validation loop (no_grad, one unit unsharded at a time) stays below the training "
                  "peak and is not replayed",
}


def mixed_precision_dtypes(precision: str) -> tuple[torch.dtype, torch.dtype]:
    """(param_dtype, reduce_dtype) of Lightning's FSDPPrecision for ``precision`` (installed Lightning)."""
    from lightning.fabric.plugins.precision.fsdp import FSDPPrecision

    config = FSDPPrecision(precision).mixed_precision_config  # type: ignore[arg-type]
    return config.param_dtype, config.reduce_dtype


@dataclass(eq=False)
class _Unit:
    """One FSDP1 unit on rank 0: its original parameters (host fakes) and its device tensors."""

    name: str
    params: list[nn.Parameter]
    world: int
    shard_dtype: torch.dtype
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    offload: bool
    memory: DeviceMemory
    root: bool = False
    shard: nn.Parameter | None = None
    full: torch.Tensor | None = None
    flat_grad_pending: int = 0
    grads_seen: int = 0
    next_in_backward: _Unit | None = None
    host_shard: torch.Tensor | None = field(default=None, repr=False)

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    @property
    def padded(self) -> int:
        return -(-self.numel // self.world) * self.world

    def full_bytes(self) -> int:
        return self.padded * self.param_dtype.itemsize

    @contextmanager
    def _stream(self, stream: int) -> Iterator[None]:
        previous, self.memory.stream = self.memory.stream, stream
        try:
            yield
        finally:
            self.memory.stream = previous

    def shard_up(self, on_device: bool) -> None:
        """FSDP1's wrap of one unit: flatten its parameters (a cat), keep rank 0's padded/W slice (a
        clone) and free the rest. ``on_device``: Fabric's ``setup`` already moved the whole model to
        the device (``move_to_device=True``, rows 08 and the ViT-H/14 FSDP bars), so the originals are
        freed as their unit flattens; with offload (``move_to_device=False``) all of it stays on the host."""
        if self.offload:
            self.memory.counting = False
        try:
            flat = torch.empty(self.padded, dtype=self.shard_dtype)  # flatten_tensors: cat
            if on_device:
                for p in self.params:  # the originals' storage, replaced by views into the flat parameter
                    self.memory.forget(p)
            self.shard = nn.Parameter(torch.empty(self.padded // self.world, dtype=self.shard_dtype))
            del flat  # flat_param.set_(shard): the full flat storage is released
        finally:
            self.memory.counting = True

    def unshard(self) -> None:
        if self.full is not None:
            return
        with self._stream(UNSHARD_STREAM):
            staged = None
            if self.offload or self.param_dtype != self.shard_dtype:
                # The shard copied to the device (offload) or cast to param_dtype (_mp_shard).
                staged = torch.empty(self.padded // self.world, dtype=self.param_dtype)
            self.full = torch.empty(self.padded, dtype=self.param_dtype)
            del staged

    def reshard(self) -> None:
        self.full = None

    def on_grad(self, param: nn.Parameter) -> None:
        """A post-accumulate-grad hook: when the unit's last gradient lands, concatenate and reduce-scatter."""
        self.grads_seen += 1
        if self.grads_seen < len(self.params):
            return
        self.grads_seen = 0
        flat = torch.empty(self.padded, dtype=self.param_dtype)  # SplitWithSizesBackward's cat
        for p in self.params:
            p.grad = None
        if self.reduce_dtype != self.param_dtype:
            flat = flat.to(self.reduce_dtype)
        with self._stream(POST_BACKWARD_STREAM):
            reduced = torch.empty(self.padded // self.world, dtype=self.reduce_dtype)
            del flat
            if reduced.dtype != self.shard_dtype:
                reduced = reduced.to(self.shard_dtype)
        assert self.shard is not None
        if self.offload:
            del reduced  # copied to the pinned host gradient, freed on the device
            self.memory.counting = False
            try:
                if self.shard.grad is None:
                    self.shard.grad = torch.empty_like(self.shard)
            finally:
                self.memory.counting = True
        elif self.shard.grad is None:
            self.shard.grad = reduced
        else:
            self.shard.grad.add_(reduced)
            del reduced
        self.reshard()


class _PreBackward(torch.autograd.Function):
    """Identity on a unit's output whose backward is FSDP1's pre-backward hook (unshard + prefetch)."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, unit: _Unit) -> torch.Tensor:  # type: ignore[override]
        ctx.unit = unit
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        unit: _Unit = ctx.unit
        unit.unshard()
        if unit.next_in_backward is not None:
            unit.next_in_backward.unshard()
        return grad, None


class _Wrapped(nn.Module):
    """FSDP(CheckpointWrapper(block)) or FSDP(block): the unit's hooks around the block's forward."""

    def __init__(self, block: nn.Module, unit: _Unit, checkpointing: bool, order: list[_Unit]) -> None:
        super().__init__()
        self.block, self.unit, self.checkpointing, self.order = block, unit, checkpointing, order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.unit.unshard()
        if self.unit not in self.order:
            self.order.append(self.unit)
        if self.checkpointing:
            from torch.utils.checkpoint import checkpoint

            y = checkpoint(self.block, x, use_reentrant=False)
        else:
            y = self.block(x)
        y = _PreBackward.apply(y, self.unit)
        self.unit.reshard()
        return y


@dataclass
class ShardedModel:
    model: nn.Module
    units: list[_Unit]
    root: _Unit
    order: list[_Unit]

    def shards(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units if u.shard is not None]


def wrap(model: nn.Module, block_class: type[nn.Module], memory: DeviceMemory, *, world: int,
         shard_dtype: torch.dtype, param_dtype: torch.dtype, reduce_dtype: torch.dtype, offload: bool,
         checkpointing: bool, auto_wrap: bool, moved: bool) -> ShardedModel:
    """Wrap ``model`` (built on the host) as FSDP1 would; allocate rank 0's shards."""
    order: list[_Unit] = []
    units: list[_Unit] = []

    def unit(name: str, params: list[nn.Parameter], root: bool = False) -> _Unit:
        made = _Unit(name, params, world, shard_dtype, param_dtype, reduce_dtype, offload, memory, root=root)
        for p in params:
            p.register_post_accumulate_grad_hook(made.on_grad)
        units.append(made)
        return made

    def replace(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if auto_wrap and isinstance(child, block_class):
                setattr(parent, name, _Wrapped(child, unit(name, list(child.parameters())), checkpointing, order))
            else:
                replace(child)

    replace(model)
    wrapped = {id(p) for u in units for p in u.params}
    root = unit("root", [p for p in model.parameters() if id(p) not in wrapped], root=True)
    # Wrapping is bottom-up (blocks first, the root last), and so is the flatten-and-shard.
    for u in units:
        u.shard_up(on_device=moved)
    return ShardedModel(model, units, root, order)


def train(session: Any, recipe: Recipe, sharded: ShardedModel, memory_steps: int,
          inputs_fn: Callable[[str, int], tuple[torch.Tensor, torch.Tensor]], precision: Any,
          attention: Any) -> dict[str, int]:
    """The 01-2 loop (zero_grad after the forward pass) under FSDP1, on rank 0."""
    memory: DeviceMemory = session.memory
    shards = sharded.shards()
    for shard in shards:
        memory.tag(shard, "parameters")
    offload = recipe.cpu_offload
    optimizer, scheduler = optimizers.build(recipe.optimizer, nn.ParameterList(shards), recipe.learning_rate, 1000)
    for group in optimizer.param_groups:
        group["foreach"] = True
    grad_bytes = 0
    accumulation = recipe.accumulation_steps
    inputs = targets = logits = loss = None
    done = 0
    # 01-2 (08/09/11): zero_grad after the forward pass. With accumulation (the bonus "after"
    # scripts): step at batch 0 and every accum-th batch, zero_grad after the step, and no
    # ``no_backward_sync``, so every micro-batch reduce-scatters into the sharded gradient.
    for batch_index in range(memory_steps * accumulation + 1):
        inputs, targets = inputs_fn(recipe.scale.name, recipe.micro_batch_size)
        sharded.root.unshard()  # the root's pre-forward; FSDP1 keeps the root unsharded after forward
        with attention:
            x = precision.convert_input(inputs)
            with precision.forward_context():
                out = sharded.model(x)
            del x
            logits = precision.convert_output(out)
            del out
        if batch_index == 0:  # backward visits units in reverse forward order; prefetch the next one
            for later, earlier in zip(sharded.order[1:], sharded.order[:-1]):
                later.next_in_backward = earlier
        loss = F.cross_entropy(logits, targets)
        if accumulation == 1:
            optimizer.zero_grad()
        else:
            loss = loss / accumulation
        precision.backward(loss)
        sharded.root.reshard()
        loss.detach().float()
        if batch_index % accumulation != 0:
            continue
        grad_bytes = memory.device_bytes(s.grad for s in shards if s.grad is not None)
        memory.in_optimizer = True
        from memclaims.sim.eras import optimizer_era

        if offload:  # the step runs on the host, over host shards and host state
            memory.counting = False
        try:
            with optimizer_era(session.profile.optimizer_era):
                optimizer.step()
        finally:
            memory.counting = True
            memory.in_optimizer = False
        for value in optimizer_state_tensors(optimizer):
            memory.tag(value, "optimizer_state")
        if accumulation > 1:
            optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        done += 1
        if done == memory_steps:
            break
    # What lives on the device, as the tracker saw it (with offload: nothing of these).
    state = (v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    device_state = memory.device_bytes(state)
    del inputs, targets, logits, loss
    return {"param_bytes": memory.device_bytes(iter(shards)), "grad_bytes": grad_bytes,
            "optimizer_state_bytes": device_state}


def check(recipe: Recipe) -> None:
    if recipe.optimizer not in ("adam", "sgd", "adamw"):
        raise UsageError(f"the sim device cannot run {recipe.id}: sharded recipes replay torch optimizers "
                         f"only (got {recipe.optimizer!r})")
