"""The sim's clock: a CPU that issues kernels and GPU streams that run them (issue #29).

A discrete-event model, written by hand because no library times fake-tensor ops on a device that
is not there (torch's own ``_tools`` estimate runtimes of FX graphs or of a real device's kernels):

- the CPU issues every kernel-launching aten op the tracker sees at ``dispatch_s`` of CPU time
  (Python, the dispatcher and the launch: ``Timing.dispatch_s``, calibrated below);
- each kernel runs on its stream for its roofline time (``op_seconds``: FLOPs over the profile GPU's
  peak for the dtype, or bytes moved over its memory bandwidth, whichever is longer), starting when
  the CPU has issued it and the stream has finished what came before;
- collectives (FSDP's all-gathers and reduce-scatters) take their ring time over the interconnect,
  host copies (CPU offload) their bytes over PCIe, each on the stream FSDP issues it on;
- the CPU runs ahead of the GPU until the launch queue is full (``queue_depth`` kernels issued and not
  finished) or it synchronizes (a value read back, torchmetrics' per-iteration ``torch.unique``);
- a block freed with pending uses on other streams (``record_stream``) goes back to its pool at the
  first allocation after those uses have finished on the GPU (the caching allocator's
  ``process_events``): ``DeviceMemory.release_after_uses``.

Every figure is a hardware peak or a calibration stated where it is defined: predictions are what the
hardware bounds, so step times come out below what a 2023 run achieved (``StepTimePrediction`` shows
published beside predicted).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class GpuPeaks:
    name: str
    fp32_tflops: float
    tf32_tflops: float
    half_tflops: float  # fp16 and bf16 tensor cores, dense
    bandwidth_gb_s: float  # decimal GB/s
    interconnect_gb_s: float  # NVLink, one direction per GPU, decimal GB/s
    pcie_gb_s: float  # host <-> device, one direction, decimal GB/s
    source: str


A100_40GB = GpuPeaks("A100-SXM4-40GB", 19.5, 156.0, 312.0, 1555.0, 300.0, 32.0,
                     "NVIDIA A100 datasheet (SXM4, dense; NVLink 3 600 GB/s bidirectional; PCIe Gen4 x16)")
H100_SXM = GpuPeaks("H100-SXM5-80GB", 67.0, 494.7, 989.4, 3350.0, 450.0, 64.0,
                    "NVIDIA H100 datasheet (SXM5, dense; NVLink 4 900 GB/s bidirectional; PCIe Gen5 x16)")
H200_SXM = GpuPeaks("H200-SXM-141GB", 67.0, 494.7, 989.4, 4800.0, 450.0, 64.0,
                    "NVIDIA H200 datasheet (SXM, dense; NVLink 4 900 GB/s bidirectional; PCIe Gen5 x16)")
GPUS = {"a100": A100_40GB, "h100": H100_SXM, "h200": H200_SXM}


@dataclass(frozen=True)
class Timing:
    """The CPU side of the clock, and how its figures were obtained."""

    # CPU seconds per launched kernel: eager dispatch (Python modules, autograd, the dispatcher) as measured
    # on this development machine (``dispatch_seconds``: an AMD EPYC with AVX512-bf16, torch 2.14.1, one thread, a
    # tiny ViT's training step: 4.4 us per aten op, median of 5 x 50 steps of 537 ops), plus a CUDA kernel
    # launch (cudaLaunchKernel: about 5 us, an assumption; not measurable without a GPU).
    dispatch_s: float = 9.4e-6
    # Kernels the CPU may have issued and the GPU not finished before a launch blocks (CUDA's launch queue,
    # the driver's push buffer): NVIDIA documents no depth. None: unbounded, the CPU runs a whole backward
    # ahead. Chosen from the article's own figures, and so a calibration: with 1,024 (a figure often quoted)
    # the sharded rows come out 0.79-0.94 of published (08 0.939, 09 and 11 0.789, ViT-H/14 FSDP 0.934,
    # + checkpointing 0.884, + offload 0.850), unbounded 0.89-1.03 (bonus_distilbert-after 0.724 either way).
    queue_depth: int | None = None
    # Host memory bandwidth for CPU offload's optimizer step (torch's foreach Adam on the host, one
    # process per GPU): decimal GB/s, an assumption for a 2023 server's one process (not logged).
    host_bandwidth_gb_s: float = 10.0
    source: str = ("dispatch_s: dispatch_seconds() on this machine + 5 us launch; queue_depth calibrated on the article's "
                   "sharded rows; host bandwidth assumed")


def dispatch_seconds(repeats: int = 5, steps: int = 50) -> float:
    """CPU seconds per aten op of an eager training step on this machine: a tiny torchvision ViT (4 blocks of
    width 8, one 16 x 16 image, one thread: compute negligible) forward and backward, its aten ops counted by
    a dispatch mode; the median of ``repeats`` loops of ``steps``. The dispatch part of ``Timing.dispatch_s``."""
    import statistics
    import time

    import torchvision
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=4, num_heads=2,
                                                 hidden_dim=8, mlp_dim=16, num_classes=10)
    inputs, targets = torch.randn(1, 3, 16, 16), torch.zeros(1, dtype=torch.long)

    def step() -> None:
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Count():  # type: ignore[no-untyped-call]
            step()
        for _ in range(10):  # warm-up
            step()
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(steps):
                step()
            samples.append((time.perf_counter() - started) / steps / Count.ops)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(samples)


def op_tensors(values: object) -> Iterator[torch.Tensor]:
    """The tensors among an aten op's arguments or results: tensors, and tuples, lists and dicts of them.
    By hand, not ``tree_flatten``: it runs once per op and the pytree machinery, general over
    registered containers, cost BigBird's replay more than the roofline arithmetic."""
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, (tuple, list)):
        for value in values:
            yield from op_tensors(value)
    elif isinstance(values, dict):
        for value in values.values():
            yield from op_tensors(value)


def _nbytes(values: object) -> int:
    return sum(t.numel() * t.element_size() for t in op_tensors(values))


# Ops that allocate and launch nothing (their memory is the tracker's business, not the clock's).
_NO_KERNEL = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
              torch.ops.aten.empty_like.default, torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default}


@functools.cache  # asked once per op dispatched; the schema does not change
def launches_kernel(func: torch._ops.OpOverload) -> bool:
    """False for views (no data moves) and allocation-only ops."""
    if func in _NO_KERNEL:
        return False
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


@dataclass(frozen=True)
class OpCost:
    seconds: float
    flops: float
    bytes: float
    compute_bound: bool


def op_seconds(func: torch._ops.OpOverload, args: Any, kwargs: Any, out: Any, gpu: GpuPeaks, *, tf32_matmul: bool,
               mixed: bool = False) -> OpCost:
    """The roofline time of one aten op on ``gpu``: FLOPs from torch's own formulas
    (``torch.utils.flop_counter``), bytes as the op's tensor inputs and outputs. ``mixed``: the FLOP-counted
    ops run in 16 bits at half the operand bytes (autocast, approximated, for callers that do not cast);
    ``tf32_matmul``: fp32 matmuls in TF32 (``set_float32_matmul_precision("high")``). Convolutions in fp32 use
    TF32 regardless (cuDNN's default)."""
    from torch.utils.flop_counter import flop_registry

    moved: float = _nbytes((args, kwargs)) + _nbytes(out)
    flops = 0.0
    if func.overloadpacket in flop_registry:
        flops = float(flop_registry[func.overloadpacket](*args, **(kwargs or {}), out_val=out))
        if mixed:
            moved /= 2
    first = next(op_tensors(args), None)
    dtype = first.dtype if first is not None else None
    if mixed or dtype in (torch.float16, torch.bfloat16):
        peak = gpu.half_tflops
    else:
        conv = func.overloadpacket in (torch.ops.aten.convolution, torch.ops.aten.convolution_backward)
        peak = gpu.tf32_tflops if (tf32_matmul or conv) else gpu.fp32_tflops
    compute = flops / (peak * 1e12) if flops else 0.0
    memory = moved / (gpu.bandwidth_gb_s * 1e9)
    return OpCost(max(compute, memory), flops, moved, compute >= memory and flops > 0)


def ring_seconds(nbytes: int, world: int, gpu: GpuPeaks) -> float:
    """An all-gather's (output bytes) or reduce-scatter's (input bytes) ring time: each rank sends and
    receives (W - 1) / W of them over its link."""
    return (world - 1) / world * nbytes / (gpu.interconnect_gb_s * 1e9) if world > 1 else 0.0


@dataclass
class Clock:
    """CPU time and each stream's GPU time, in seconds since the clock started."""

    gpu: GpuPeaks
    timing: Timing = field(default_factory=Timing)
    cpu: float = 0.0
    streams: dict[int, float] = field(default_factory=dict)
    kernels: int = 0
    busy: dict[int, float] = field(default_factory=dict)  # GPU seconds run per stream
    _in_flight: list[float] = field(default_factory=list, repr=False)  # end times of issued kernels (a heap)

    def launch(self, seconds: float, stream: int = 0) -> float:
        """Issue a kernel of ``seconds`` on ``stream``; when it ends on the GPU."""
        self.cpu += self.timing.dispatch_s
        heap = self._in_flight
        while heap and heap[0] <= self.cpu:
            heapq.heappop(heap)
        depth = self.timing.queue_depth
        if depth is not None and len(heap) >= depth:  # the launch blocks until the oldest kernel finishes
            self.cpu = heapq.heappop(heap)
            while heap and heap[0] <= self.cpu:
                heapq.heappop(heap)
        start = max(self.cpu, self.streams.get(stream, 0.0))
        end = start + seconds
        self.streams[stream] = end
        self.busy[stream] = self.busy.get(stream, 0.0) + seconds
        self.kernels += 1
        heapq.heappush(heap, end)
        return end

    def wait_stream(self, waiter: int, waited: int) -> None:
        """``waiter.wait_stream(waited)``: later work on ``waiter`` starts after what ``waited`` has queued."""
        self.streams[waiter] = max(self.streams.get(waiter, 0.0), self.streams.get(waited, 0.0))

    def event(self, *streams: int) -> float:
        """When an event recorded now on each of ``streams`` completes: after the work queued there."""
        return max([self.cpu, *(self.streams.get(s, 0.0) for s in streams)])

    def wait_until(self, when: float) -> None:
        """The CPU blocks until ``when`` (``event.synchronize()``)."""
        self.cpu = max(self.cpu, when)

    def host_work(self, seconds: float) -> None:
        """CPU time spent on work that is not a launch (the host optimizer step of CPU offload)."""
        self.cpu += seconds

    def synchronize(self) -> float:
        """``torch.cuda.synchronize()``: the CPU waits for every stream; the time after it."""
        self.cpu = max([self.cpu, *self.streams.values()])
        self._in_flight.clear()
        return self.cpu


def last_step_seconds(step_ends: list[float]) -> float | None:
    """The last optimizer step's predicted seconds (the first starts at the load: it is not a step's time);
    None with fewer than two steps or without a clock."""
    return step_ends[-1] - step_ends[-2] if len(step_ends) >= 2 else None
