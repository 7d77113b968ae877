"""Sharded recipes on the simulated GPU: one rank of FSDP1 as Lightning's FSDPStrategy ran it.

The article's 08/09/11 scripts and the ViT-H/14 series use ``FSDPStrategy`` (FSDP1: one
``FlatParameter`` per wrapped unit, ``use_orig_params=True``), 4 ranks, auto-wrap on the
transformer block, optionally activation checkpointing on the block (non-reentrant, inside the
FSDP unit) and ``CPUOffload(offload_params=True)``. No process group is needed to know what one
rank holds: every rank holds the same shapes, so this replays rank 0 alone on fake tensors, with
FSDP1's allocations emulated around the real model's forward and backward (per-rank accounting):

- units: one per transformer block (the modules Lightning's auto-wrap policy selects, from the plan as Lightning's
  FSDPStrategy configures it: memclaims.techniques.impl.lightning_fsdp_plan), and the root (every parameter outside
  the blocks). Each unit's flat parameter is padded to a multiple of the world size; a rank keeps ``1/W`` of it
  (the shard) in the original dtype, on the device unless offloaded;
- forward: each unit all-gathers its full flat parameter (in ``MixedPrecision.param_dtype``: the installed
  Lightning's, from that plan, or the 2023 Lightning's, ``mixed_precision_dtypes``) before its forward and frees it after, except
  the root, which FSDP1 keeps unsharded until the end of backward. With offload, the shard is first
  copied to the device (a shard-sized temporary);
- backward: a unit's pre-backward all-gathers it again and prefetches the next unit
  (``BackwardPrefetch.BACKWARD_PRE``, the default), so two blocks are unsharded at once; the
  original parameters' gradients are views of one flat gradient, concatenated when the last
  arrives (``SplitWithSizesBackward``: the per-parameter gradients and the flat one coexist
  briefly); the reduce-scatter writes a shard-sized gradient (cast to the reduce dtype first
  when it differs) and the full one is freed; with offload the sharded gradient goes to the host;
- the optimizer steps over the shards (Adam state ``2/W`` of the model), on the host with offload;
- with offload, each unit's reduce-scattered gradient stays on the device as ``_saved_grad_shard``
  (``_runtime_utils._post_backward_hook``: kept to accumulate into, only copied to the pinned host
  gradient) until the end-of-backward callback (``_post_backward_final_callback`` ->
  ``FlatParamHandle.prepare_gradient_for_optim`` deletes it): a whole rank's gradient shard, 1/W of the
  model, is on the device at the end of every backward even though the step runs on the host;
- no rate limiter in the article's nightly (``limit_all_gathers=False``, FSDP1's default until pytorch
  PR #104900 of 2023-07-11; Lightning's FSDPStrategy never set it): an unsharded flat parameter is
  freed with ``record_stream`` on the compute stream (``FlatParamHandle._free_unsharded_flat_param``),
  so its block returns to the unshard stream's pool only when the GPU has run that unit. The loop syncs
  once per iteration (torchmetrics' ``update`` validates with ``torch.unique``), after which the CPU
  issues the forward (a few hundred kernels, well within the launch queue) long before the GPU has run
  its first blocks: every unit's all-gather buffer of the forward is live at once in the unshard
  stream's pool (PR #83917, which added the limiter: "preventing a fast CPU thread from over-allocating
  blocks to the all-gather stream"). On the sim's timeline (memclaims.sim.timeline) each such free, and
  the backward's (unsharded parameters, and flat gradients freed with ``record_stream`` on the post-backward
  stream), returns its block when the GPU has run its uses (``DeviceMemory.free_after_uses``); the limiter,
  where the profile's torch has it, makes the CPU wait for the oldest of two free events. Without the
  timeline (profile ``article-untimed``) the replay holds the forward's buffers until the first pre-backward
  hook has all-gathered (so those two take fresh blocks too), then frees them, and frees the backward's at once;
- streams: all-gathers run on FSDP's unshard stream and reduce-scatters on its post-backward
  stream; the allocator keeps free blocks per stream, which is what makes FSDP reserve more than
  it allocates.

Sharding strategies (issue #27; ``SHARDING_NOTES``): the above is FULL_SHARD, the article's. SHARD_GRAD_OP
skips the reshard after each unit's forward (every unit stays gathered until its post-backward hook,
so nothing is left for the run-ahead either); NO_SHARD keeps each whole flat parameter as its "shard",
gathers nothing (a ``param_dtype`` copy under mixed precision), keeps the whole flat gradient (all-reduced
in place) and whole optimizer state; HYBRID_SHARD shards each unit over one simulated node's ranks
(``memclaims.techniques.technique_registry.shard_group_size``) and all-reduces the shard across nodes in place.

FSDP2 (issue #27; ``fully_shard``, Lightning's ``ModelParallelStrategy``; ``wrap(..., fsdp2=True)``,
``_Fsdp2Group``), as the installed torch's ``torch/distributed/fsdp/_fully_shard`` does it (verified in its
source, cited at each step in ``_Fsdp2Group``):

- groups: one ``fully_shard`` call per transformer block, then the root (every other parameter), as
  memclaims' parallelize_fn and the CPU ranks call it. No flat parameter: each parameter is padded on dim 0
  to ``ceil(size0 / W) * W`` rows and rank 0 keeps one chunk of ``ceil(size0 / W)`` rows in a storage of its
  own (``FSDPParam._init_sharded_param``); with nothing moved by Fabric first (ModelParallelStrategy's
  ``module_to_device`` is a no-op), each call moves its group's parameters to the device whole and shards
  them there (``_move_states_to_device``), group after group;
- unshard: one all-gather output buffer per group (``foreach_all_gather``: the group's padded numel, on the
  all-gather copy-in stream), then the copy-out into per-parameter unsharded tensors
  (``foreach_all_gather_copy_out``: ``init_all_gather_outputs``/``alloc_all_gather_outputs``, padded sizes,
  on the current stream): both are live until the copy-out ends. In the backward the output is freed right
  after its copy-out; in the forward it is kept until the next group's copy-out begins
  (``FSDPParamGroup.wait_for_unshard``, ``comm_ctx.all_gather_state``; [Note: Overlapping all-gather copy-in
  and all-gather]), and the root's post-forward frees the last one (``FSDPState._post_forward``);
- reshard: the unsharded parameters are freed after a group's forward when ``reshard_after_forward`` is
  True (``FSDPParamGroup.reshard``); with False they stay until the group's post-backward. The root's is
  False (``fully_shard``'s ``None`` default: False for the root);
- backward: a group's pre-backward all-gathers it (unless prefetched) and copies out, and all-gathers the
  group before it in forward order (``_backward_prefetch``: implicit prefetch of one group; its copy-out
  waits for that group's own pre-backward); the root's pre-backward, on the logits, prefetches the last block;
- post-backward (``FSDPParamGroup.post_backward``, ``foreach_reduce``): the unsharded parameters are freed
  (``reshard_after_backward``); the previous group's reduce-scatter input is released (at most
  ``reduce_scatter_max_input_buffers``, 1 by default, in flight); the unsharded gradients are copied into one
  padded reduce-scatter input (current stream) and freed; the reduce-scatter output (``W`` times smaller, on
  the reduce-scatter stream) holds the sharded gradients, which are views into it (``torch.as_strided``), or
  are added into the existing ones when accumulating; the root's final callback releases the last input;
- no ``record_stream`` anywhere: FSDP2 synchronizes its streams with CUDA events (``record_event`` /
  ``wait_event`` in ``_fsdp_collectives.py`` and ``_fsdp_param_group.py``; the FSDP2 design, pytorch issue
  #114299 "Per-Parameter-Sharding FSDP Tracker", section "FSDP, Streams, & Avoiding recordStream": FSDP1,
  FairScale and DeepSpeed use recordStream, per-parameter-sharding FSDP "uses manual synchronization instead"), and
  the all-gather state above is what keeps the CPU from running ahead: there is no run-ahead of unsharded
  buffers to replay, and the backward's frees are not timing either (``UNMODELLED``'s record_stream bound
  is FSDP1's);
- precision: memclaims' parallelize_fn passes no ``MixedPrecisionPolicy``; FSDP2 all-gathers and
  reduce-scatters in the parameters' own dtype, and mixed precision is autocast's.

Not predicted, and bounded in ``UNMODELLED``: NCCL's own buffers (outside the caching allocator,
so outside ``max_memory_reserved``: 0 by construction), how far the CPU also runs ahead in the
backward (timing: the replay frees the backward's unsharded parameters and gradients at once; at
most every unit's unsharded parameter and flat gradient more, ``backward_run_ahead_bound``), and the
evaluation loop.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.core.record import GRADIENTS, OPTIMIZER_STATE, PARAMETERS
from memclaims.measure import optimizers
from memclaims.measure.tensors import optimizer_state_tensors
from memclaims.sim.eras import optimizer_era
from memclaims.sim.repeat import RepeatedMicroBatches
from memclaims.sim.timeline import last_step_seconds, ring_seconds
from memclaims.sim.tracker import DeviceMemory
from memclaims.techniques.base import merge_observed
from memclaims.techniques.technique_registry import SHARDINGS, reshard_after_forward, shard_group_size

if TYPE_CHECKING:

    from memclaims.recipes.recipe import Recipe
    from memclaims.sim.replay import Session, SimPrecision

WORLD_SIZE = 4  # the article's multi-GPU runs and the ViT-H/14 series: 4 GPUs
DEFAULT_STREAM, UNSHARD_STREAM, POST_BACKWARD_STREAM = 0, 1, 2

UNMODELLED = {
    "nccl": "NCCL's communication buffers are cudaMalloc'd outside the caching allocator: not in "
            "max_memory_reserved, so 0 by construction",
    "record_stream": "in the backward, frees across streams (record_stream) wait for the GPU; how far the "
                     "CPU runs ahead there is timing, which only the timeline models: untimed, the replay frees the backward's "
                     "unsharded parameters and flat gradients at once. Bound: at most every unit's "
                     "unsharded parameter and flat gradient more (backward_run_ahead_bound)",
    "evaluation": "the validation loop (no_grad: no saved activations; its all-gathers, run ahead or not, "
                  "reuse the unshard pool the training forward filled) stays below the training peak and is "
                  "not replayed",
}


# What each sharding strategy but FULL_SHARD changes in the replay (a sharded recipe's notes).
FSDP2_NOTE = ("FSDP2 fully_shard (per-parameter dim-0 shards, one all-gather buffer per group copied out into "
              "per-parameter unsharded tensors, sharded gradients viewing one reduce-scatter output per group; CUDA "
              "events, no record_stream: no run-ahead)")

SHARDING_NOTES = {
    "SHARD_GRAD_OP": "no reshard after a unit's forward: every unit's flat parameter stays gathered from its "
                     "forward until its post-backward reduce-scatter",
    "NO_SHARD": "each unit's whole flat parameter, flat gradient (all-reduced in place) and optimizer state on "
                "the rank; no all-gather",
    "HYBRID_SHARD": "FULL_SHARD within a simulated node (memclaims.core.techniques.HYBRID_NODES nodes of the "
                    "ranks), the shards' gradients all-reduced across nodes in place",
}


def limit_all_gathers(optimizer_era: str) -> bool:
    """FSDP1's ``limit_all_gathers`` default in the torch a profile replays: ``False`` in the 2023-06-23
    nightly (the era whose foreach Adam the ``2023-06`` optimizer era replays), ``True`` from pytorch
    PR #104900 (merged 2023-07-11, in the 2.1 release) on."""
    return optimizer_era != "2023-06"


@dataclass(eq=False)
class _RunAhead:
    """The forward's unsharded flat parameters whose frees wait for the GPU (no rate limiter)."""

    limit_all_gathers: bool
    pending: list[torch.Tensor] = field(default_factory=list)
    # With the timeline: the rate limiter's free events (GPU times), at most two all-gathers in flight
    # (``_FreeEventQueue``, ``_max_num_inflight_all_gathers = 2``).
    free_events: list[float] = field(default_factory=list)

    def release(self) -> None:
        self.pending.clear()

    def before_all_gather(self, memory: DeviceMemory) -> None:
        """``_unshard`` under the rate limiter: the CPU waits for the oldest free event when two are queued."""
        if memory.clock is not None and self.limit_all_gathers and len(self.free_events) >= 2:
            memory.clock.wait_until(self.free_events.pop(0))


def backward_run_ahead_bound(param_count: int, param_dtype: torch.dtype) -> int:
    """Upper bound of what the backward's CPU run-ahead can add (``UNMODELLED["record_stream"]``): every
    unit's unsharded flat parameter (unshard stream) and unsharded flat gradient (freed with
    ``record_stream`` on the post-backward stream) still taken at once, i.e. two unsharded models in
    ``param_dtype``. The replay itself frees them at once (the lower end)."""
    return 2 * param_count * param_dtype.itemsize


# (param_dtype, reduce_dtype) of Lightning's FSDPPrecision from PR #17670 (2023-05-23) until PR #21361
# (2025-11-21): the article's 2.1.0.dev0 and the 2.1-2.5 releases. "*-mixed" kept the all-gathered
# parameters in fp32 and left the half-precision compute to autocast (so every weight is cast per op,
# and without activation checkpointing the fp16 casts are saved for the backward); #21361 made
# "*-mixed" all-gather in the half dtype, as "*-true" does. Before pytorch-lightning PR #17807
# (2023-07-09) "*-true" ran through HalfPrecision rather than FSDPPrecision: the model converted to the
# half dtype, FSDP without MixedPrecision, i.e. the same dtypes as below.
LIGHTNING_2023_FSDP_DTYPES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "16-mixed": (torch.float32, torch.float16),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "16-true": (torch.float16, torch.float16),
    "bf16-true": (torch.bfloat16, torch.bfloat16),
    "32-true": (torch.float32, torch.float32),
}
LIGHTNING_ERAS = ("installed", "2023")


def mixed_precision_dtypes(precision: str, lightning_era: str = "installed") -> tuple[torch.dtype, torch.dtype]:
    """(param_dtype, reduce_dtype) of Lightning's FSDPPrecision for ``precision``: the installed Lightning's,
    or (``lightning_era="2023"``) that of the Lightning the article and the ViT-H/14 series ran."""
    if lightning_era == "2023":
        return LIGHTNING_2023_FSDP_DTYPES[precision]
    if lightning_era != "installed":
        raise UsageError(f"unknown Lightning era {lightning_era!r}; valid: {', '.join(LIGHTNING_ERAS)}")
    from lightning.fabric.plugins.precision.fsdp import FSDPPrecision

    config = FSDPPrecision(precision).mixed_precision_config  # type: ignore[arg-type]
    # None would mean "keep the parameters' dtype"; every precision FSDPPrecision accepts sets both.
    return config.param_dtype or torch.float32, config.reduce_dtype or torch.float32


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
    # FSDP1's sharding strategy (``wrap``): SHARD_GRAD_OP does not reshard after the forward; NO_SHARD keeps
    # the whole flat parameter as its "shard" (``world`` 1), all-reduces the flat gradient and gathers nothing.
    reshard_after_forward: bool = True
    no_shard: bool = False
    shard: nn.Parameter | None = None
    full: torch.Tensor | None = None
    flat_grad_pending: int = 0
    grads_seen: int = 0
    # Parameters of this unit the current backward reaches (``expect_gradients``); FSDP1's post-backward
    # hook fires once per backward, when the flat parameter's gradient is complete, whether or not every
    # original parameter took part (a classifier that skips the pooler leaves two without a gradient).
    expected_grads: int | None = None
    next_in_backward: _Unit | None = None
    host_shard: torch.Tensor | None = field(default=None, repr=False)
    run_ahead: _RunAhead = field(default_factory=lambda: _RunAhead(True))
    saved_grad_shard: torch.Tensor | None = field(default=None, repr=False)  # offload: on the device

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
        freed as their unit flattens. With offload (``move_to_device=False``) the model is on the host,
        but Lightning passes ``device_id``, so ``_init_utils._move_module_to_device`` moves the unit's
        parameters to the device first: they are flattened and sharded there, and only the shard goes
        to the host (``_init_param_handle_from_params``: ``flat_param_to(cpu)``), unit after unit."""
        moved_here = [torch.empty(p.shape, dtype=self.shard_dtype) for p in self.params] if self.offload else []
        flat = torch.empty(self.padded, dtype=self.shard_dtype)  # flatten_tensors: cat
        if on_device:
            for p in self.params:  # the originals' storage, replaced by views into the flat parameter
                self.memory.forget(p)
        del moved_here
        if self.no_shard:  # FlatParamHandle.shard: NO_SHARD keeps the flat parameter itself, nothing cloned
            self.shard = nn.Parameter(flat)
            return
        shard = torch.empty(self.padded // self.world, dtype=self.shard_dtype)
        del flat  # flat_param.set_(shard): the full flat storage is released
        if not self.offload:
            self.shard = nn.Parameter(shard)
            return
        del shard  # flat_param_to(cpu): the shard moves to (pinned) host memory
        with self.memory.outside():
            self.shard = nn.Parameter(torch.empty(self.padded // self.world, dtype=self.shard_dtype))

    def unshard(self) -> None:
        if self.full is not None:
            return
        if self.no_shard:
            if self.param_dtype != self.shard_dtype:  # NO_SHARD gathers nothing; mixed precision casts (_mp_shard)
                with self._stream(UNSHARD_STREAM):
                    self.full = torch.empty(self.padded, dtype=self.param_dtype)
            return
        self.run_ahead.before_all_gather(self.memory)
        with self._stream(UNSHARD_STREAM):
            staged = None
            if self.offload or self.param_dtype != self.shard_dtype:
                # The shard copied to the device (offload) or cast to param_dtype (_mp_shard).
                staged = torch.empty(self.padded // self.world, dtype=self.param_dtype)
                self._timed_copy(staged, host=self.offload)
            self.full = torch.empty(self.padded, dtype=self.param_dtype)
            self._collective(self.full.untyped_storage().nbytes())
            del staged
        self._wait(DEFAULT_STREAM, UNSHARD_STREAM)  # the unit's computation waits for its all-gather

    # --- the timeline (memclaims.sim.timeline; nothing without a clock) ---------------------------

    def _collective(self, nbytes: int) -> None:
        """An all-gather (output bytes) or reduce-scatter (input bytes) on the current stream."""
        if self.memory.clock is not None:
            self.memory.launch(ring_seconds(nbytes, self.world, self.memory.clock.gpu))

    def _timed_copy(self, tensor: torch.Tensor, host: bool) -> None:
        """A copy or cast into ``tensor`` on the current stream: over PCIe from or to the host, or on the device."""
        clock = self.memory.clock
        if clock is not None:
            rate = clock.gpu.pcie_gb_s if host else clock.gpu.bandwidth_gb_s / 2  # a cast reads and writes
            self.memory.launch(tensor.untyped_storage().nbytes() / (rate * 1e9))

    def _wait(self, waiter: int, waited: int) -> None:
        if self.memory.clock is not None:
            self.memory.clock.wait_stream(waiter, waited)

    def _free_unsharded(self) -> None:
        """``_free_unsharded_flat_param``: ``record_stream`` on the compute stream, then the storage freed; with
        the rate limiter a free event is queued (``_reshard``). Without a clock: freed at once."""
        full, self.full = self.full, None
        if full is None or self.memory.clock is None:
            return
        self.memory.free_after_uses(full, DEFAULT_STREAM)
        if self.run_ahead.limit_all_gathers:
            self.run_ahead.free_events.append(self.memory.clock.event(DEFAULT_STREAM))

    def sharded_params(self) -> list[nn.Parameter]:
        """What the optimizer steps over: the unit's flat shard."""
        return [self.shard] if self.shard is not None else []

    def gathered(self) -> int:
        """Elements of the unit now held unsharded (gathered, padding included; NO_SHARD gathers nothing)."""
        return self.padded if self.full is not None and not self.no_shard else 0

    def prefetch(self) -> None:
        """The backward's prefetch of this unit (FSDP1: the whole unshard)."""
        self.unshard()

    def pre_backward(self) -> None:
        """FSDP1's pre-backward hook: unshard, prefetch the next unit (BACKWARD_PRE)."""
        self.unshard()
        if self.next_in_backward is not None:
            self.next_in_backward.unshard()
        # The GPU is still in the forward when the CPU reaches the first pre-backward hook (its two
        # all-gathers above took fresh blocks); the replay then lets the forward's buffers go.
        self.run_ahead.release()

    def reshard(self, after_forward: bool = False) -> None:
        """Free the unsharded flat parameter; after a forward without the rate limiter its block stays
        taken until the GPU has run the unit (record_stream on the compute stream), see ``_RunAhead``.
        SHARD_GRAD_OP keeps it after the forward (``_reshard_after_forward`` is False): only the
        post-backward frees it."""
        if after_forward and not self.reshard_after_forward:
            return
        if self.memory.clock is not None:
            self._free_unsharded()
            return
        if after_forward and not self.run_ahead.limit_all_gathers and self.full is not None:
            self.run_ahead.pending.append(self.full)
        self.full = None

    def on_grad(self, param: nn.Parameter) -> None:
        """A post-accumulate-grad hook: when the unit's last gradient lands, concatenate and reduce-scatter."""
        self.grads_seen += 1
        if self.grads_seen < (len(self.params) if self.expected_grads is None else self.expected_grads):
            return
        self.grads_seen = 0
        flat = torch.empty(self.padded, dtype=self.param_dtype)  # SplitWithSizesBackward's cat
        self._timed_copy(flat, host=False)
        for p in self.params:
            p.grad = None
        if self.reduce_dtype != self.param_dtype:
            flat = flat.to(self.reduce_dtype)
        assert self.shard is not None
        if self.no_shard:
            # _reduce_grad_no_shard: the flat gradient is all-reduced in place and kept whole, in the shard's dtype.
            if flat.dtype != self.shard_dtype:
                flat = flat.to(self.shard_dtype)
            self.shard.grad = _summed(self.shard.grad, flat)
            del flat
            self.reshard()
            return
        self._wait(POST_BACKWARD_STREAM, DEFAULT_STREAM)
        with self._stream(POST_BACKWARD_STREAM):
            reduced = torch.empty(self.padded // self.world, dtype=self.reduce_dtype)
            self._collective(flat.untyped_storage().nbytes())
            if self.memory.clock is not None:  # produced on the compute stream, used here: record_stream
                self.memory.free_after_uses(flat, POST_BACKWARD_STREAM)
            del flat
            if reduced.dtype != self.shard_dtype:
                reduced = reduced.to(self.shard_dtype)
            if self.offload:  # _offload_grad: the sharded gradient to the pinned host gradient
                self._timed_copy(reduced, host=True)
        assert self.shard is not None
        if self.offload:
            # _post_backward_hook keeps the sharded gradient on the device as ``_saved_grad_shard`` (to
            # accumulate into) and copies it to the pinned host gradient; prepare_gradient_for_optim
            # deletes it at the end of the backward (end_backward).
            self.saved_grad_shard = _summed(self.saved_grad_shard, reduced)
            del reduced
            with self.memory.outside():  # the pinned host gradient
                if self.shard.grad is None:
                    self.shard.grad = torch.empty_like(self.shard)
        else:
            self.shard.grad = _summed(self.shard.grad, reduced)
            del reduced
        self.reshard()

    def end_backward(self) -> None:
        """``_post_backward_final_callback``: the compute stream waits for the reduce-scatters; with offload the
        CPU waits for the host gradient copies (``current_stream().synchronize()``) and the device's
        ``_saved_grad_shard`` goes."""
        self._wait(DEFAULT_STREAM, POST_BACKWARD_STREAM)
        if self.offload and self.memory.clock is not None:
            self.memory.clock.wait_until(self.memory.clock.event(DEFAULT_STREAM))
        self.saved_grad_shard = None


@dataclass(eq=False)
class _Fsdp2Comm:
    """FSDP2's ``FSDPCommContext`` as far as memory goes: the forward's last all-gather output (kept until the
    next group's copy-out) and the reduce-scatter inputs in flight."""

    in_backward: bool = False
    all_gather_state: torch.Tensor | None = field(default=None, repr=False)
    reduce_scatter_inputs: list[torch.Tensor] = field(default_factory=list, repr=False)

    def end_forward(self) -> None:
        """The root's post-forward frees the last all-gather result (``FSDPState._post_forward``)."""
        self.all_gather_state = None

    def end_backward(self) -> None:
        """The root's final callback releases the reduce-scatter states (``FSDPState._root_post_backward_final_callback``)."""
        self.in_backward = False
        self.reduce_scatter_inputs.clear()


def _dims(p: torch.Tensor) -> tuple[int, int]:
    """(dim 0, elements per dim-0 row) of a parameter; a 0-dim one is one row of one."""
    shape = list(p.shape) or [1]
    rest = 1
    for d in shape[1:]:
        rest *= d
    return shape[0], rest


@dataclass(eq=False)
class _Fsdp2Group(_Unit):
    """One FSDP2 parameter group (one ``fully_shard`` call) on rank 0: per-parameter dim-0 shards, no
    flat parameter; the module docstring says what each step allocates, and where torch does it."""

    comm: _Fsdp2Comm = field(default_factory=_Fsdp2Comm)
    sharded: list[nn.Parameter] = field(default_factory=list)
    all_gather_output: torch.Tensor | None = field(default=None, repr=False)
    unsharded: list[torch.Tensor] | None = field(default=None, repr=False)

    def _rows(self, p: torch.Tensor) -> int:
        """_fsdp_param.py: ``padded_sharded_size = chunks[0].size()``, ``torch.chunk`` of dim 0 into W: ceil(d0/W)."""
        return -(-_dims(p)[0] // self.world)

    @property
    def padded(self) -> int:
        """The group's all-gather output (and reduce-scatter input) numel: each parameter's dim 0 padded to a
        multiple of W (``_get_dim0_padded_size``)."""
        return sum(self._rows(p) * self.world * _dims(p)[1] for p in self.params)

    def shard_up(self, on_device: bool) -> None:
        """``fully_shard`` on this group: ``_move_states_to_device`` (the parameters on the device whole, unless
        Fabric moved them already), then ``FSDPParam._init_sharded_param`` per parameter
        (``param_data.new_zeros(padded_sharded_size)``, the rank's chunk copied in); the whole ones go."""
        moved_here = [] if on_device else [torch.empty(p.shape, dtype=self.shard_dtype) for p in self.params]
        self.sharded = [nn.Parameter(torch.empty((self._rows(p), *list(p.shape)[1:]), dtype=self.shard_dtype))
                        for p in self.params]
        if on_device:
            for p in self.params:
                self.memory.forget(p)
        del moved_here

    def sharded_params(self) -> list[nn.Parameter]:
        return list(self.sharded)

    def gathered(self) -> int:
        """Parameter elements unsharded now: the unsharded parameters are ``as_strided`` views of the padded
        all-gather outputs with each parameter's own size (``FSDPParam.init_unsharded_param``)."""
        return sum(p.numel() for p in self.params) if self.unsharded is not None else 0

    def _all_gather(self) -> None:
        """``foreach_all_gather``: ``all_gather_comm.allocate((all_gather_input_numel * world_size,))`` on the
        all-gather copy-in stream; the rank's input is a view into it (``all_gather_copy_in``)."""
        with self._stream(UNSHARD_STREAM):
            self.all_gather_output = torch.empty(self.padded, dtype=self.param_dtype)

    def prefetch(self) -> None:
        """``_prefetch_unshard`` in backward: the all-gather only; the copy-out waits for the group's
        pre-backward."""
        if self.unsharded is None and self.all_gather_output is None:
            self._all_gather()

    def unshard(self) -> None:
        """``unshard`` + ``wait_for_unshard``: in the forward, the previous group's all-gather output is freed
        first (``comm_ctx.all_gather_state = None``), this one's kept after the copy-out; in the backward
        this one's is freed right after it."""
        if self.unsharded is not None:
            return
        if self.all_gather_output is None:
            self._all_gather()
        if not self.comm.in_backward:
            self.comm.all_gather_state = None
        # foreach_all_gather_copy_out: per-parameter padded outputs on the current stream, split_with_sizes_copy.
        self.unsharded = [torch.empty(self._rows(p) * self.world * _dims(p)[1], dtype=self.param_dtype)
                          for p in self.params]
        output, self.all_gather_output = self.all_gather_output, None
        if not self.comm.in_backward:
            self.comm.all_gather_state = output
        del output

    def pre_backward(self) -> None:
        """``FSDPParamGroup.pre_backward``: unshard (a no-op if kept after forward), prefetch one group."""
        self.comm.in_backward = True
        self.unshard()
        if self.next_in_backward is not None:
            self.next_in_backward.prefetch()

    def reshard(self, after_forward: bool = False) -> None:
        """``FSDPParamGroup.reshard``: after the forward only with ``reshard_after_forward``; the unsharded
        parameters' storages are freed (``free_storage``), no record_stream."""
        if after_forward and not self.reshard_after_forward:
            return
        self.unsharded = None

    def on_grad(self, param: nn.Parameter) -> None:
        """``post_backward`` when the group's last gradient lands: reshard, release the previous reduce-scatter
        input, copy the unsharded gradients into this one's and free them, reduce-scatter into one output
        whose views are the sharded gradients (or which is added into them when they exist)."""
        self.grads_seen += 1
        if self.grads_seen < (len(self.params) if self.expected_grads is None else self.expected_grads):
            return
        self.grads_seen = 0
        self.reshard()
        self.comm.reduce_scatter_inputs.clear()  # at most reduce_scatter_max_input_buffers (1) in flight
        reduce_scatter_input = torch.empty(self.padded, dtype=self.reduce_dtype)  # foreach_reduce_scatter_copy_in
        for p in self.params:  # unsharded_grads.clear(): only after the copy-in
            p.grad = None
        with self._stream(POST_BACKWARD_STREAM):
            reduce_output = torch.empty(self.padded // self.world, dtype=self.reduce_dtype)
        offset = 0
        for shard in self.sharded:
            view = reduce_output.narrow(0, offset, shard.numel()).view(shard.shape)
            offset += shard.numel()
            if shard.grad is None:
                shard.grad = view  # fsdp_param.sharded_param.grad = to_sharded_dtensor(new_sharded_grad)
            else:
                shard.grad.add_(view)  # sharded_param.grad._local_tensor += new_sharded_grad
            del view
        del reduce_output
        self.comm.reduce_scatter_inputs.append(reduce_scatter_input)
        del reduce_scatter_input


def _summed(held: torch.Tensor | None, arrived: torch.Tensor) -> torch.Tensor:
    """A gradient slot after a gradient arrives: the arrival itself the first time, else added in place."""
    if held is None:
        return arrived
    held.add_(arrived)
    return held


class _PreBackward(torch.autograd.Function):
    """Identity on a unit's output whose backward is FSDP1's pre-backward hook (unshard + prefetch)."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, unit: _Unit) -> torch.Tensor:
        ctx.unit = unit
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        unit: _Unit = ctx.unit
        unit.pre_backward()
        return grad, None


class _Wrapped(nn.Module):
    """FSDP(CheckpointWrapper(block)) or FSDP(block): the unit's hooks around the block's forward."""

    def __init__(self, block: nn.Module, unit: _Unit, checkpointing: bool, order: list[_Unit]) -> None:
        super().__init__()
        self.block, self.unit, self.checkpointing, self.order = block, unit, checkpointing, order

    def __getattr__(self, name: str) -> Any:
        """The block's attributes, as FSDP and CheckpointWrapper forward them (``TransformerEncoder``
        reads ``layers[0].self_attn``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.block, name)

    def forward(self, *args: Any, **kwargs: Any) -> object:
        self.unit.unshard()
        if self.unit not in self.order:
            self.order.append(self.unit)
        if self.checkpointing:
            from torch.overrides import _get_current_function_mode_stack
            from torch.utils.checkpoint import checkpoint

            from memclaims.sim.autocast import CudaAutocastPolicy

            # checkpoint restores torch.autocast's state for the recompute (on a GPU: CUDA autocast's
            # whole policy); the emulated CUDA policy is a function mode it does not know: re-enter it.
            stack = _get_current_function_mode_stack()
            policy = any(isinstance(m, CudaAutocastPolicy) for m in stack)

            def contexts() -> tuple[AbstractContextManager[object], AbstractContextManager[object]]:
                return nullcontext(), (CudaAutocastPolicy() if policy else nullcontext())

            y = checkpoint(self.block, *args, use_reentrant=False, context_fn=contexts, **kwargs)
        else:
            y = self.block(*args, **kwargs)
        # FSDP1 registers its pre-backward hook on every tensor output (text blocks return tuples).
        if isinstance(y, torch.Tensor):
            y = cast(torch.Tensor, _PreBackward.apply(y, self.unit))
        elif isinstance(y, tuple):
            y = tuple(cast(torch.Tensor, _PreBackward.apply(t, self.unit))
                      if isinstance(t, torch.Tensor) and t.requires_grad else t for t in y)
        self.unit.reshard(after_forward=True)
        return y


@dataclass
class ShardedModel:
    model: nn.Module
    units: list[_Unit]
    root: _Unit
    order: list[_Unit]
    run_ahead: _RunAhead
    # FSDP2's shared state (``wrap(..., fsdp2=True)``); None: FSDP1's units.
    comm: _Fsdp2Comm | None = None
    offload: bool = False  # CPUOffload(offload_params=True): the shards, their gradients and the step on the host

    @property
    def api(self) -> str:
        """Which FSDP the replay is (the Record's ``fsdp_api``)."""
        return "fsdp2" if self.comm is not None else "fsdp1"

    def end_forward(self) -> None:
        if self.comm is not None:
            self.comm.end_forward()

    def end_backward(self) -> None:
        self.run_ahead.release()
        for unit in self.units:
            unit.end_backward()
        if self.comm is not None:
            self.comm.end_backward()

    def shards(self) -> list[nn.Parameter]:
        return [p for u in self.units for p in u.sharded_params()]

    def unsharded_params(self) -> int:
        """Parameter elements now held unsharded (FSDP1: the gathered flat parameters, padding included;
        FSDP2: the unsharded parameters' own sizes)."""
        return sum(u.gathered() for u in self.units)

    def expect_gradients(self, loss: torch.Tensor) -> None:
        """Count, per unit, the parameters ``loss``'s backward will give a gradient (its graph's leaves)."""
        reached: set[int] = set()
        seen: set[object] = set()
        stack = [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf's gradient sink
            if variable is not None:
                reached.add(id(variable))
            stack.extend(child for child, _ in node.next_functions)
        for unit in self.units:
            unit.expected_grads = sum(id(p) in reached for p in unit.params)


def wrap(model: nn.Module, block_class: type[nn.Module], memory: DeviceMemory, *, world: int,
         shard_dtype: torch.dtype, param_dtype: torch.dtype, reduce_dtype: torch.dtype, offload: bool,
         checkpointing: bool, auto_wrap: bool, moved: bool, limit_gathers: bool = True,
         sharding: str = "FULL_SHARD", fsdp2: bool = False, wrap_units: Collection[nn.Module] | None = None,
         checkpointed: Collection[nn.Module] | None = None) -> ShardedModel:
    """Wrap ``model`` (built on the host) as FSDP1 would; allocate rank 0's shards. ``limit_gathers``:
    FSDP1's ``limit_all_gathers`` (see ``limit_all_gathers``). ``sharding``: FSDP1's ShardingStrategy;
    a unit is sharded over ``shard_group_size(sharding, world)`` ranks (HYBRID_SHARD: one simulated node's).
    ``fsdp2``: FSDP2's ``fully_shard`` groups instead (``_Fsdp2Group``), FULL_SHARD as
    ``reshard_after_forward=True``, SHARD_GRAD_OP as False; no offload, no other strategy. ``wrap_units``: the modules
    an auto-wrap policy selects (a plan Lightning configured: memclaims.techniques.impl.lightning_fsdp_plan), in place
    of every ``block_class`` module under ``auto_wrap``; ``checkpointed``: the units checkpointing wraps, in place of
    every unit under ``checkpointing``."""
    if sharding not in SHARDINGS:
        raise UsageError(f"unknown sharding strategy {sharding!r}; valid: {', '.join(SHARDINGS)}")
    if fsdp2 and (sharding not in ("FULL_SHARD", "SHARD_GRAD_OP") or offload):
        raise UsageError(f"the sim's FSDP2 replay takes reshard_after_forward True or False (FULL_SHARD, SHARD_GRAD_OP) "
                         f"without offload (got {sharding}{', offload' if offload else ''})")
    world = shard_group_size(sharding, world)
    order: list[_Unit] = []
    units: list[_Unit] = []
    run_ahead = _RunAhead(True if fsdp2 else limit_gathers)  # FSDP2: CUDA events, nothing runs ahead
    comm = _Fsdp2Comm() if fsdp2 else None

    def unit(name: str, params: list[nn.Parameter], root: bool = False) -> _Unit:
        # FSDP2's root: reshard_after_forward None -> False for the root (fully_shard's docstring).
        reshard = reshard_after_forward(sharding) and not (fsdp2 and root)
        made: _Unit
        if comm is not None:
            made = _Fsdp2Group(name, params, world, shard_dtype, param_dtype, reduce_dtype, offload, memory,
                               root=root, run_ahead=run_ahead, reshard_after_forward=reshard, comm=comm)
        else:
            made = _Unit(name, params, world, shard_dtype, param_dtype, reduce_dtype, offload, memory, root=root,
                         run_ahead=run_ahead, reshard_after_forward=reshard, no_shard=sharding == "NO_SHARD")
        for p in params:
            p.register_post_accumulate_grad_hook(made.on_grad)
        units.append(made)
        return made

    chosen = None if wrap_units is None else {id(m) for m in wrap_units}
    recomputed = None if checkpointed is None else {id(m) for m in checkpointed}

    def is_unit(module: nn.Module) -> bool:
        return auto_wrap and isinstance(module, block_class) if chosen is None else id(module) in chosen

    def replace(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if is_unit(child):
                checkpoint = checkpointing if recomputed is None else id(child) in recomputed
                setattr(parent, name, _Wrapped(child, unit(name, list(child.parameters())), checkpoint, order))
            else:
                replace(child)

    replace(model)
    if recomputed and recomputed - {id(w.block) for w in model.modules() if isinstance(w, _Wrapped)}:
        raise UsageError("the sim replays activation checkpointing of FSDP's wrapped units only: the checkpointing "
                         "policy selects modules its auto-wrap policy does not wrap")
    wrapped = {id(p) for u in units for p in u.params}
    root = unit("root", [p for p in model.parameters() if id(p) not in wrapped], root=True)
    # Wrapping is bottom-up (blocks first, the root last), and so is the flatten-and-shard.
    for u in units:
        u.shard_up(on_device=moved)
    return ShardedModel(model, units, root, order, run_ahead, comm, offload)


def train(session: Session, recipe: Recipe, sharded: ShardedModel, memory_steps: int,
          inputs_fn: Callable[[object, int], tuple[object, torch.Tensor]], precision: SimPrecision,
          attention: AbstractContextManager[object]) -> tuple[dict[str, Any], int]:
    """The 01-2 loop (zero_grad after the forward pass) under FSDP1, on rank 0: the Record's state
    fields, and how many micro-batches repeated the recorded ones and were replayed from their
    allocations (memclaims.sim.repeat)."""
    memory: DeviceMemory = session.memory
    shards = sharded.shards()
    for shard in shards:
        memory.tag(shard, PARAMETERS)
    offload = sharded.offload
    optimizer, scheduler = optimizers.build(recipe.optimizer, nn.ParameterList(shards), recipe.learning_rate, 1000,
                                            implementation=recipe.optimizer_impl, owner=recipe.optimizer_owner)
    if recipe.optimizer_impl is None:  # torch's default for CUDA: foreach (fake shards would take the for-loop)
        for group in optimizer.param_groups:
            group["foreach"] = True
    grad_bytes = 0
    accumulation = recipe.accumulation_steps
    inputs = targets = logits = loss = None
    done = 0
    forward_unsharded: int | None = None
    repeats = RepeatedMicroBatches(memory, accumulation)
    step_ends: list[float] = []  # the timeline's time at the end of each optimizer step
    # 01-2 (08/09/11): zero_grad after the forward pass. With accumulation (the bonus "after"
    # scripts): step at batch 0 and every accum-th batch, zero_grad after the step, and no
    # ``no_backward_sync``, so every micro-batch reduce-scatters into the sharded gradient.
    for batch_index in range(memory_steps * accumulation + 1):
        # A micro-batch like the recorded ones replays its allocations; the optimizer step always runs.
        if not repeats.replay(batch_index):
            with repeats.running(batch_index):
                inputs, targets = inputs_fn(recipe.scale, recipe.micro_batch_size)
                sharded.root.unshard()  # the root's pre-forward; FSDP1 keeps the root unsharded after forward
                with attention:
                    x = precision.convert_input(inputs)
                    with precision.forward_context():
                        out = recipe.workload.logits(sharded.model, x)
                    del x
                    logits = precision.convert_output(out)
                    del out
                sharded.end_forward()
                if batch_index == 0:  # backward visits units in reverse forward order; prefetch the next one
                    for later, earlier in zip(sharded.order[1:], sharded.order[:-1]):
                        later.next_in_backward = earlier
                    if sharded.comm is not None and sharded.order:  # FSDP2's root prefetches the last block
                        sharded.root.next_in_backward = sharded.order[-1]
                if sharded.comm is not None:  # FSDP2 registers the root's pre-backward hook on its outputs
                    logits = cast(torch.Tensor, _PreBackward.apply(logits, sharded.root))
                if forward_unsharded is None:  # after the first forward pass: what it left gathered
                    forward_unsharded = sharded.unsharded_params()
                loss = F.cross_entropy(logits, targets)
                if accumulation == 1:
                    optimizer.zero_grad()
                else:
                    loss = loss / accumulation
                sharded.expect_gradients(loss)
                precision.backward(loss)
                sharded.end_backward()
                sharded.root.reshard()
                loss.detach().float()
                memory.synchronize()  # the loop reads the loss (.item()): the CPU waits for the GPU
        if batch_index % accumulation != 0:
            continue
        grad_bytes = memory.device_bytes(s.grad for s in shards if s.grad is not None)
        memory.in_optimizer = True
        try:  # with offload the step runs on the host, over host shards and host state
            with memory.outside() if offload else nullcontext(), optimizer_era(session.profile.optimizer_era):
                optimizer.step()
        finally:
            memory.in_optimizer = False
        if offload and memory.clock is not None:  # the host step: its passes over the shards' bytes
            passes = 3 if recipe.optimizer == "sgd" else 7  # SGD: read p, g, write p; Adam: + two states
            memory.clock.host_work(passes * memory.host_bytes(iter(shards))
                                   / (memory.clock.timing.host_bandwidth_gb_s * 1e9))
        for value in optimizer_state_tensors(optimizer):
            memory.tag(value, OPTIMIZER_STATE)
        if accumulation > 1:
            optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        if memory.clock is not None:  # the loop reads a value back once per step (loss.item())
            step_ends.append(memory.clock.synchronize())
        done += 1
        if done == memory_steps:
            break
    # What lives on the device, as the tracker saw it (with offload: nothing of these), and what
    # offload keeps on the host instead, by category.
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    device_state = memory.device_bytes(state)
    host_state = {PARAMETERS: memory.host_bytes(shards),
                  GRADIENTS: memory.host_bytes(s.grad for s in shards if s.grad is not None),
                  OPTIMIZER_STATE: memory.host_bytes(state)} if offload else {}
    del inputs, targets, logits, loss
    states: dict[str, object] = {
        "param_bytes": memory.device_bytes(iter(shards)), "grad_bytes": grad_bytes,
        "optimizer_state_bytes": device_state, "host_state_bytes": host_state,
        "forward_unsharded_params": forward_unsharded, "fsdp_api": sharded.api,
        "predicted_step_s": last_step_seconds(step_ends)}
    for hooks in recipe.hooks:  # what a technique observes of the rank's optimizer (its implementation)
        merge_observed(states, hooks.sim_observe(sharded.model, optimizer, session))
    return states, repeats.replayed


def check(recipe: Recipe) -> None:
    if recipe.optimizer not in ("adam", "sgd", "adamw"):
        raise UsageError(f"the sim device cannot run {recipe.id}: sharded recipes replay torch optimizers "
                         f"only (got {recipe.optimizer!r})")
