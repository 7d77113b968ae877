"""How memory is read: the CUDA caching allocator's statistics, or exact tensor accounting on the CPU.

Both probes measure named phases (``load``, ``train``, ...); each phase reports its own peak, so
loading and training never blur into one number. A probe never decides what a phase is: the
runner opens the phases.
"""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import torch
from torch import nn


@dataclass
class PhasePeak:
    allocated_bytes: int
    reserved_bytes: int | None = None  # CUDA (and sim) only
    breakdown: dict[str, int] = field(default_factory=dict)  # category -> bytes at the peak


class Probe(Protocol):
    name: str
    phases: dict[str, PhasePeak]

    def prepare(self) -> None: ...
    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None: ...
    def phase(self, name: str) -> Any: ...
    def step_begin(self) -> None: ...


class HostMemory:
    """Peak resident set size (host memory) of this process from ``start()`` on.

    Linux keeps a high-water mark of the resident set (``VmHWM``) and resets it when 5 is written
    to ``/proc/self/clear_refs``, so two runs in one process each get their own peak; that matters
    for CPU offload, which moves memory to the host. Elsewhere only the lifetime peak
    (``ru_maxrss``) exists, and ``resettable`` says so. Neither psutil nor torch offers a resettable
    peak, hence this small reader.
    """

    STATUS = "/proc/self/status"
    CLEAR_REFS = "/proc/self/clear_refs"

    def __init__(self, status: str = STATUS, clear_refs: str = CLEAR_REFS) -> None:
        self.status, self.clear_refs = status, clear_refs
        self.resettable = False

    def start(self) -> None:
        try:
            with open(self.clear_refs, "w") as handle:
                handle.write("5")
            self.resettable = self._high_water_mark() is not None
        except OSError:
            self.resettable = False

    def peak_bytes(self) -> int | None:
        if self.resettable:
            return self._high_water_mark()
        try:
            import resource
        except ImportError:  # Windows
            return None
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux reports KiB

    def _high_water_mark(self) -> int | None:
        try:
            with open(self.status) as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024  # "VmHWM:  123456 kB"
        except OSError:
            pass
        return None


def storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared storages count once)."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        key = storage.data_ptr() if storage.data_ptr() else id(storage)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes, exact, on any device."""
    params = list(model.parameters())
    return {
        "param_bytes": storage_bytes(iter(params)),
        "grad_bytes": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state_bytes": storage_bytes(optimizer_state_tensors(optimizer)) if optimizer else 0,
    }


# --- CPU: exact live bytes of tensor storages --------------------------------------------------

# torch's MemTracker already tracks every storage through a dispatch mode with weakref finalizers
# and sorts it by category; we only map its categories onto the Record's.
_CATEGORY = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations_and_temporaries",
    "Temp": "activations_and_temporaries",
    "Input": "activations_and_temporaries",
    "Other": "activations_and_temporaries",
}


def _breakdown(snapshot: dict[Any, int]) -> dict[str, int]:
    result: dict[str, int] = {}
    for key, value in snapshot.items():
        label = getattr(key, "value", key)
        if label == "Total":
            continue
        category = _CATEGORY.get(str(label), "activations_and_temporaries")
        result[category] = result.get(category, 0) + int(value)
    return result


class CpuProbe:
    """Counts every tensor storage alive on the CPU, exactly; deterministic run to run."""

    name = "cpu-exact"

    def __init__(self) -> None:
        from torch.distributed._tools.mem_tracker import MemTracker

        self._tracker_class = MemTracker
        self._tracker: Any = None
        self.phases: dict[str, PhasePeak] = {}

    def prepare(self) -> None:
        gc.collect()

    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._tracker = self._tracker_class()
        self._tracker.track_external(*(x for x in (model, optimizer) if x is not None))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        # A phase after ``track`` counts the tracked model states from the start; a phase before
        # it (loading) counts what is created inside it.
        tracker = self._tracker = self._tracker or self._tracker_class()
        try:
            with tracker:
                yield
                peak = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
        finally:
            self._tracker = None
        self.phases[name] = PhasePeak(allocated_bytes=int(peak.get("Total", 0)), breakdown=_breakdown(peak))

    def step_begin(self) -> None:
        # MemTracker keeps per-module statistics for one forward pass; the global peak survives.
        if self._tracker is not None:
            self._tracker.reset_mod_stats()


# --- CUDA: the caching allocator's statistics ---------------------------------------------------


class CudaProbe:
    """Peak allocated and reserved per phase, read from ``torch.cuda``.

    ``cuda`` is injectable so that the arithmetic is tested against faked statistics on machines
    without a GPU; everything CUDA-specific this suite calls goes through it.
    """

    name = "cuda-allocator"

    def __init__(self, cuda: Any = None, history_entries: int | None = None) -> None:
        from memclaims import diagnosis

        self.cuda = cuda if cuda is not None else torch.cuda
        # Allocator events to keep for a memory_viz snapshot on failure (0: off); None: the
        # session's setting (--memclaims-memory-history), since the runner builds the probe.
        # A fake ``cuda`` gets no history unless asked: fakes need not model torch.cuda.memory.
        session_default = diagnosis.history_entries() if cuda is None else 0
        self.history_entries = session_default if history_entries is None else history_entries
        self.phases: dict[str, PhasePeak] = {}
        self._model_states: tuple[nn.Module, torch.optim.Optimizer | None] | None = None

    def prepare(self) -> None:
        """Start clean: no cached blocks or cuBLAS workspaces from earlier cases, fresh peaks."""
        gc.collect()
        self.cuda.synchronize()
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None and self.cuda is torch.cuda:
            clear_workspaces()
        self.cuda.empty_cache()
        self.cuda.reset_peak_memory_stats()
        if self.history_entries > 0:
            from memclaims.diagnosis import start_history

            start_history(self.cuda, self.history_entries)

    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._model_states = (model, optimizer)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.cuda.synchronize()
        self.cuda.reset_peak_memory_stats()
        yield
        self.cuda.synchronize()
        allocated = int(self.cuda.max_memory_allocated())
        breakdown: dict[str, int] = {}
        if self._model_states is not None:
            states = model_state_bytes(*self._model_states)
            breakdown = {
                "parameters": states["param_bytes"],
                "gradients": states["grad_bytes"],
                "optimizer_state": states["optimizer_state_bytes"],
            }
            # The allocator does not label blocks: the rest of the peak is activations and
            # temporaries, derived by subtraction.
            breakdown["activations_and_temporaries"] = max(0, allocated - sum(breakdown.values()))
        self.phases[name] = PhasePeak(
            allocated_bytes=allocated,
            reserved_bytes=int(self.cuda.max_memory_reserved()),
            breakdown=breakdown,
        )

    def step_begin(self) -> None:
        pass

    def capture_snapshot(self, recipe_id: str) -> None:
        """The allocator history of this recipe's measured steps, saved now (memclaims.diagnosis)."""
        if self.history_entries > 0:
            from memclaims.diagnosis import capture_snapshot

            self.cuda.synchronize()
            capture_snapshot(self.cuda, recipe_id)


def make_probe(device: str) -> Probe:
    return CudaProbe() if device == "cuda" else CpuProbe()
