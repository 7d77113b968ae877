"""Feeds every tensor storage created on the simulated device into the allocator model.

A dispatch mode sees each aten op below autograd, so it sees every new storage: outputs,
saved activations, gradients, optimizer state, temporaries. ``DeviceMemory`` is such a mode (stacked
above a ``FakeTensorMode`` in tests); the sim runs it inside its fake mode (``tracked_fake_mode``). A storage is allocated when an op
first returns it and freed when its last reference dies (a weakref callback, as torch's
MemTracker does), which is exactly when the CUDA allocator would get the block back.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

import memclaims.sim.cache_key as cache_key
import memclaims.sim.known_values as known_values
from memclaims.core.record import ACTIVATIONS, CATEGORIES
from memclaims.sim.allocator import CachingAllocator
from memclaims.sim.profiles import Profile
from memclaims.sim.rnn_workspace import RNN_LAYER, with_workspace
from memclaims.sim.timeline import Clock, launches_kernel, op_seconds, op_tensors

OTHER = ACTIVATIONS  # what an untagged storage counts as

aten = torch.ops.aten
# Ops that run cuBLAS GEMMs on a GPU: the first one on each thread creates that handle's workspace.
_GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_FLASH_FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
# A fake tensor's ``.device`` is dispatched; the autograd engine asks it about 25,000 times per
# BigBird micro-batch (two thirds of all dispatches there), and it allocates nothing.
_DEVICE = torch.ops.prim.device.default


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class DeviceMemory(TorchDispatchMode):
    """Counts the storages created while ``counting`` is on as simulated device memory."""

    def __init__(self, allocator: CachingAllocator, profile: Profile) -> None:
        # TorchDispatchMode.__init__ is unannotated, and mypy's untyped_calls_exclude does not
        # reach calls through super().
        super().__init__()  # type: ignore[no-untyped-call]
        self.allocator, self.profile = allocator, profile
        self.counting = True
        self.in_optimizer = False
        # The stream new storages are allocated on (0: the default stream); the sharded replay
        # switches it around FSDP's all-gathers and reduce-scatters.
        self.stream = 0
        self._handles: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> handle
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._bytes: dict[int, int] = {}
        self._category: dict[int, str] = {}
        self._workspaces: list[int] = []
        self.live: dict[str, int] = dict.fromkeys(CATEGORIES, 0)  # tensor bytes by category
        self.tensor_bytes = 0
        self.peak_tensor_bytes = 0
        self.breakdown_at_peak: dict[str, int] = dict(self.live)
        # Where reserved memory last grew to its peak: the evidence for "which allocation, which
        # phase" sets a row's figure (the op, its request, and whether the optimizer step ran).
        self.op: object = "?"  # the op running now; named only when it sets a peak
        self.reserved_peak_site: dict[str, object] = {}
        self.trace: list[tuple[Any, ...]] | None = None  # the primitives' events, while recording
        # The timeline (memclaims.sim.timeline): every kernel-launching op advances it; None: memory only.
        self.clock: Clock | None = None
        self.tf32_matmul = False  # set_float32_matmul_precision("high") in the replayed script
        # Scratch of ops whose insides the dispatch does not see (a custom op whose kernel allocates before its
        # output), registered by a technique's sim hooks: op -> (op, args, kwargs) -> the bytes its kernel holds
        # beside its output (qlora: bitsandbytes' gemm_4bit dequantizes the whole weight before its matmul).
        self.op_scratch: dict[Any, Callable[[Any, Any, Any], int]] = {}

    # --- phases -----------------------------------------------------------------------------

    def reset_peaks(self) -> None:
        self.allocator.reset_peaks()
        self.peak_tensor_bytes = self.tensor_bytes
        self.breakdown_at_peak = dict(self.live)

    # --- dispatch ---------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> object:
        if func is _DEVICE or not self.counting:
            return func(*args, **(kwargs or {}))
        return self.dispatch(func, args, kwargs, lambda: func(*args, **(kwargs or {})))

    def dispatch(self, func: Any, args: Any, kwargs: Any, run: Callable[[], Any]) -> object:
        if func in _GEMMS:
            self._ensure_workspace()
        kernel = None
        scratch: list[int] = []
        if func is _FLASH_FORWARD or func is _FLASH_BACKWARD:
            # The CPU flash kernel stands in for the profile's GPU kernel; its memory differences
            # (output layout, copies, scratch) are added here.
            kernel = self.profile.kernel(_dtype_name(args[0].dtype))
            scratch = self._attention_copies(func, kernel, args)
        elif self.op_scratch and func in self.op_scratch:
            scratch = [self.scratch(self.op_scratch[func](func, args, kwargs or {}))]
        self.op = func
        out = run()
        if func is RNN_LAYER:
            out = with_workspace(args, out)
        if kernel in _BLHD_KERNELS:
            out = _blhd_outputs(func, out)
        # An output that aliases an input (a view, an in-place op: its schema says so) allocates
        # nothing; counting it would make a view of a storage the device does not hold (a host tensor,
        # or one ``forget`` dropped) a new allocation for as long as that storage lives.
        aliases = _aliased_returns(func)
        for value, alias in zip(out if len(aliases) > 1 else (out,), aliases):
            for leaf in () if alias else op_tensors(value):
                self.track(leaf)
        if func is _FLASH_BACKWARD and kernel == "flash":
            self._flash2_backward_scratch(args[0])
        for handle in scratch:
            self.free_scratch(handle)
        if self.clock is not None and launches_kernel(func):
            self.launch(op_seconds(func, args, kwargs, out, self.clock.gpu, tf32_matmul=self.tf32_matmul).seconds)
        return out

    def track(self, tensor: torch.Tensor, category: str = OTHER) -> None:
        storage = tensor.untyped_storage()
        if storage in self._handles:
            return
        # Non-capturable optimizers keep their step counters (and a 1.0 constant) on the host:
        # one-element tensors created inside ``step`` never reach the GPU.
        if self.in_optimizer and tensor.numel() <= 1:
            return
        handle = self.count(storage.nbytes(), category)
        if handle:
            self.attach(storage, handle)

    def tag(self, tensor: torch.Tensor, category: str) -> None:
        """Re-label a tracked storage (a parameter, a gradient, optimizer state)."""
        handle = self._handles.get(tensor.untyped_storage())
        if handle is not None:
            self.retag(handle, category)

    def device_bytes(self, tensors: Any) -> int:
        """Bytes of the distinct storages behind ``tensors`` that live on the simulated device."""
        seen: dict[int, int] = {}
        for tensor in tensors:
            handle = self._handles.get(tensor.untyped_storage())
            if handle is not None:
                seen[handle] = self._bytes[handle]
        return sum(seen.values())

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage is on the simulated device already."""
        return tensor.untyped_storage() in self._handles

    def host_bytes(self, tensors: Any) -> int:
        """Bytes of the distinct storages behind ``tensors`` that the simulated device does not hold
        (a GPU run keeps them on the host: CPU offload's shards, gradients and optimizer state)."""
        seen: dict[int, int] = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if self._handles.get(storage) is None:
                seen[id(storage)] = storage.nbytes()
        return sum(seen.values())

    @contextmanager
    def outside(self) -> Iterator[None]:
        """Storages made in the block are not the device's: a host copy, unified memory."""
        counting, self.counting = self.counting, False
        try:
            yield
        finally:
            self.counting = counting

    def free_after_uses(self, tensor: torch.Tensor, *streams: int) -> None:
        """Free ``tensor``'s storage now, as FSDP1 does after ``record_stream``: its block waits for the work
        queued on ``streams`` (``release_after_uses``). The caller drops its own reference."""
        handle = self._untrack(tensor)
        if handle is not None:
            self.release_after_uses(handle, streams)

    def forget(self, tensor: torch.Tensor) -> None:
        """Stop counting a storage that a GPU run keeps on the host."""
        handle = self._untrack(tensor)
        if handle is not None:
            self.release(handle)

    def _untrack(self, tensor: torch.Tensor) -> int | None:
        """Take ``tensor``'s storage off its handle (its death no longer releases it); the handle, if any."""
        handle: int | None = self._handles.pop(tensor.untyped_storage(), None)
        if handle is not None:
            self._refs.pop(handle, None)
        return handle

    # --- the primitives: every change to the device's memory is one of these -----------------
    # While ``trace`` is a list each appends an event; memclaims.sim.repeat replays the events of a
    # recorded micro-batch through the same primitives.

    def count(self, nbytes: int, category: str) -> int:
        """Allocate ``nbytes`` of tensor memory on the current stream; the handle (0 for no bytes)."""
        if self.clock is not None:
            self.allocator.process_events(self.clock.cpu)
        reserved_before = self.allocator.stats.reserved
        handle = self.allocator.malloc(nbytes, self.stream)
        if handle == 0:
            return 0
        if self.allocator.stats.reserved > reserved_before and \
                self.allocator.stats.reserved >= self.allocator.stats.peak_reserved:
            self.reserved_peak_site = {"op": str(self.op), "request_bytes": nbytes, "in_optimizer_step": self.in_optimizer,
                                       "reserved_bytes": self.allocator.stats.reserved}
        self._bytes[handle] = nbytes
        self._category[handle] = category
        self.live[category] += nbytes
        self.tensor_bytes += nbytes
        if self.tensor_bytes > self.peak_tensor_bytes:
            self.peak_tensor_bytes = self.tensor_bytes
        self._breakdown_if_at_peak()
        if self.trace is not None:
            self.trace.append(("count", handle, nbytes, self.stream, category, str(self.op), self.in_optimizer))
        return handle

    def release(self, handle: int) -> None:
        """Free the tensor memory behind ``handle``."""
        self._free(handle, None)
        if self.trace is not None:
            self.trace.append(("release", handle))

    def release_after_uses(self, handle: int, streams: tuple[int, ...]) -> None:
        """Free ``handle`` whose block has uses queued on ``streams`` (``record_stream``): it returns to its
        pool when the GPU has run them (``allocator.free(ready_at=...)``); at once without a clock."""
        self._free(handle, None if self.clock is None else self.clock.event(*streams))
        if self.trace is not None:
            self.trace.append(("release_after", handle, streams))

    def _free(self, handle: int, ready_at: float | None) -> None:
        nbytes = self._bytes.pop(handle)
        self.live[self._category.pop(handle)] -= nbytes
        self.tensor_bytes -= nbytes
        self.allocator.free(handle, ready_at)

    def launch(self, seconds: float, stream: int | None = None) -> None:
        """Issue a kernel of ``seconds`` on ``stream`` (the current one by default) on the clock."""
        if self.clock is None:
            return
        stream = self.stream if stream is None else stream
        self.clock.launch(seconds, stream)
        if self.trace is not None:
            self.trace.append(("launch", seconds, stream))

    def synchronize(self) -> None:
        """The CPU waits for every stream (a value read back); nothing without a clock."""
        if self.clock is None:
            return
        self.clock.synchronize()
        if self.trace is not None:
            self.trace.append(("sync", None))

    def retag(self, handle: int, category: str) -> None:
        if self._category[handle] == category:
            return
        nbytes = self._bytes[handle]
        self.live[self._category[handle]] -= nbytes
        self.live[category] += nbytes
        self._category[handle] = category
        if self.trace is not None:
            self.trace.append(("retag", handle, category))

    def scratch(self, nbytes: int) -> int:
        """Allocate memory that is not a tensor's (a cuBLAS workspace, a kernel's scratch)."""
        if self.clock is not None:
            self.allocator.process_events(self.clock.cpu)
        handle = self.allocator.malloc(nbytes)
        if self.trace is not None and handle:
            self.trace.append(("scratch", handle, nbytes))
        return handle

    def free_scratch(self, handle: int) -> None:
        self.allocator.free(handle)
        if self.trace is not None:
            self.trace.append(("free_scratch", handle))

    def note_breakdown(self) -> None:
        """Take the tensor breakdown now if allocated memory is at its peak (after scratch allocations)."""
        self._breakdown_if_at_peak()
        if self.trace is not None:
            self.trace.append(("note_breakdown",))

    # --- storages ---------------------------------------------------------------------------

    def attach(self, storage: torch.UntypedStorage, handle: int) -> None:
        """Make ``storage`` own ``handle``: it is released when the storage dies."""
        self._handles[storage] = handle
        self._refs[handle] = weakref.ref(storage, self._finalizer(handle))

    def detach(self, handle: int) -> torch.UntypedStorage | None:
        """The storage that owns ``handle``, no longer releasing it when it dies (None: no storage)."""
        ref = self._refs.pop(handle, None)
        storage = None if ref is None else ref()
        if storage is not None:
            del self._handles[storage]
        return storage

    # --- internals --------------------------------------------------------------------------

    def _breakdown_if_at_peak(self) -> None:
        if self.allocator.stats.allocated >= self.allocator.stats.peak_allocated:
            self.breakdown_at_peak = dict(self.live)

    def _finalizer(self, handle: int) -> Callable[[weakref.ref[torch.UntypedStorage]], None]:
        def freed(_: weakref.ref[torch.UntypedStorage]) -> None:
            if self._refs.pop(handle, None) is not None:
                self.release(handle)

        return freed

    def _ensure_workspace(self) -> None:
        # Forward runs on the main thread, backward on autograd's device thread: one handle each.
        index = 1 if torch._C._current_graph_task_id() != -1 else 0
        while len(self._workspaces) <= index and len(self._workspaces) < len(self.profile.cublas_workspace_bytes):
            size = self.profile.cublas_workspace_bytes[len(self._workspaces)]
            self._workspaces.append(self.scratch(size))

    def _attention_copies(self, func: Any, kernel: str, args: Any) -> list[int]:
        """flash-attention v1 (torch 2.0/2.1) reshapes q, k, v (and, in backward, the output
        gradient) to (B*L, H, D) before the kernel: copies that live for the call only."""
        if kernel != "flash-v1":
            return []
        if func is _FLASH_FORWARD:
            tensors = args[:3]
        else:
            tensors = (args[0],) + tuple(args[1:4])  # grad_out, query, key, value
        return [self.scratch(t.numel() * t.element_size()) for t in tensors]

    def _flash2_backward_scratch(self, grad_out: torch.Tensor) -> None:
        """flash-attention v2 backward: fp32 dq_accum and softmax_d beside the gradients, freed at once."""
        if not self.profile.flash_backward_scratch:
            return
        batch, heads, length, head_dim = grad_out.shape
        rounded = _round_up(length, 128)
        scratch = [
            self.scratch(batch * heads * rounded * 4),  # softmax_d
            self.scratch(batch * heads * rounded * _round_up(head_dim, 32) * 4),  # dq_accum
        ]
        self.note_breakdown()
        for handle in scratch:
            self.free_scratch(handle)


# Kernels whose outputs (and gradients) are contiguous (B, L, H, D) buffers seen as (B, H, L, D).
_BLHD_KERNELS = ("efficient", "flash-v1")


def _blhd(tensor: torch.Tensor) -> torch.Tensor:
    batch, heads, length, head_dim = tensor.shape
    return tensor.new_empty((batch, length, heads, head_dim)).transpose(1, 2)


def _blhd_outputs(func: Any, out: Any) -> object:
    """The memory-efficient and flash-v1 kernels' layouts.

    The CPU flash kernel (like CUDA's flash-attention v2) lays its output out like the query, which
    in ``F.multi_head_attention_forward`` is (L, B, H, D); the memory-efficient kernel and
    flash-attention v1 allocate (B, L, H, D), so the ``permute(2, 0, 1, 3)`` that follows must copy
    (one (B, L, E) tensor per layer, saved for the out-projection's backward). Their gradients
    come back in the same layout, which decides the copies of the backward of the views above.
    """
    if func is _FLASH_FORWARD:
        return (_blhd(out[0]),) + tuple(out[1:])
    return tuple(_blhd(t) for t in out)


@functools.cache
def _aliased_returns(func: object) -> tuple[bool, ...]:
    """Per output of an op, whether its schema declares it an alias of an input (``Tensor(a)``); an
    operator without a schema (a higher-order op) counts as one fresh output."""
    schema = getattr(func, "_schema", None)
    return (False,) if schema is None else tuple(ret.alias_info is not None for ret in schema.returns)


def _fresh_returns(func: object, out: object) -> object:
    """``out`` with a tensor its op returned twice as two fresh outputs, where the schema declares no alias.

    A fake kernel run without FakeTensorMode's dispatch cache (an op's first call with its signature, before the
    process-wide cache holds it; every call with an input carrying a constant, memclaims.sim.known_values) may
    return one tensor for two outputs: ``mkldnn_rnn_layer_backward``'s meta kernel gives both bias gradients as
    one tensor, where the CPU kernel (and the cache, which makes each output anew) gives two; autograd would then
    copy one before accumulating it (an extra ``new_empty_strided`` + ``copy_`` on the timeline, which the real
    kernel never makes it run)."""
    if not isinstance(out, tuple) or len(out) < 2:
        return out
    seen: set[int] = set()
    fresh = list(out)
    for index, (value, alias) in enumerate(zip(out, _aliased_returns(func))):
        if not isinstance(value, torch.Tensor) or alias:
            continue
        if id(value) in seen:
            fresh[index] = value.new_empty_strided(value.size(), value.stride())
        seen.add(id(value))
    return tuple(fresh)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tracked_fake_mode(memory: DeviceMemory) -> Any:
    """A ``FakeTensorMode`` that feeds every op it runs into ``memory``. One mode instead of ``memory``
    stacked above a fake mode: each op crosses Python's dispatch once, not twice (BigBird's micro-batch
    dispatches about 36,000 ops, two thirds of them ``.device`` queries from the autograd engine). Ops the
    fake mode runs inside another op (decompositions, the tracker's own arithmetic) are not the device's
    allocations, exactly as when the stacked tracker was popped during its op. The tracker's code runs
    inside the mode's dispatch, where the mode is off: it makes tensors from fake ones (``new_empty``),
    never with a factory function (which would make a real tensor)."""
    from torch._subclasses.fake_tensor import _DISPATCH_META_HANDLERS, FakeTensorMode

    device_handler: Callable[[Any], Any] = _DISPATCH_META_HANDLERS[_DEVICE]

    class TrackedFakeMode(FakeTensorMode):
        def __init__(self) -> None:
            super().__init__()
            self.memory = memory
            self.inside = False
            self.no_device: bool = FakeTensorMode.avoid_device_init.fget(self)  # type: ignore[attr-defined]
            # The training phase: factories of constants carry their values (memclaims.sim.known_values).
            self.knowing = False

        @contextmanager
        def knowing_values(self, knowing: bool = True) -> Iterator[None]:
            """Values made from constants are known inside the block (``knowing=False``: unknown, a batch)."""
            before, self.knowing = self.knowing, knowing
            try:
                yield
            finally:
                self.knowing = before

        def may_turn_const(self, t: torch.Tensor) -> bool:
            if not self.knowing:
                return bool(super().may_turn_const(t))
            return known_values.small_enough(t) and not self.is_our_fake(t)

        def _run(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> object:
            made = known_values.known_factory(self, func, args, kwargs) if self.knowing else None
            return made if made is not None else _fresh_returns(func, self.dispatch(func, types, args, kwargs))

        @property
        def avoid_device_init(self) -> bool:
            # Asked once, not per constant tensor (4,000 times in a BigBird replay): Lightning sets
            # PYTORCH_NVML_BASED_CUDA_CHECK=1 on import, and then every torch.cuda.is_available() loads NVML
            # through ctypes. Whether this machine has a GPU does not change during a replay.
            return self.no_device

        if cache_key.SUPPORTED:
            def _prep_args_for_hash(self, result: list[object], args: Any, state: Any,
                                    id_hashed_objects: list[object]) -> None:
                # The same cache key, built faster (memclaims.sim.cache_key).
                cache_key.prep_args_for_hash(self, super()._prep_args_for_hash, result, args, state, id_hashed_objects)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> object:
            # ``dispatch`` is what FakeTensorMode's own ``__torch_dispatch__`` calls, less its wrappers
            # (an op counter and a second dynamo guard: this method already has one).
            if func is _DEVICE:  # what ``dispatch`` answers it with, less a no_dispatch context and a debug log
                return device_handler(args)
            if self.inside or not memory.counting:
                return self.dispatch(func, types, args, kwargs or {})
            self.inside = True
            try:
                return memory.dispatch(func, args, kwargs, lambda: self._run(func, types, args, kwargs or {}))
            finally:
                self.inside = False

    return TrackedFakeMode()
