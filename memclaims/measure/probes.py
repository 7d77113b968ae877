"""How memory is read: the CUDA caching allocator's statistics, or exact tensor accounting on the CPU.

Both probes measure named phases (``load``, ``train``, ...); each phase reports its own peak, so
loading and training never blur into one number. Inside ``train`` the training loop
(``memclaims.measure.loop``) opens the phases of a step (``forward``, ``backward``, ``optimizer_step``,
``zero_grad``) through ``step_phase``; those report the largest peak over the measured steps and
keep each step's peak, so that a leak (a peak growing step after step) is visible. A probe never
decides what a phase is: the runner and the loop open the phases.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from memclaims.core.record import ACTIVATIONS, BUFFERS, GRADIENTS, OPTIMIZER_STATE, PARAMETERS
from memclaims.measure.heartbeat import beat
from memclaims.measure.tensors import optimizer_state_tensors, storage_bytes

if TYPE_CHECKING:  # torch.distributed loads with the cpu probe only
    from torch.distributed._tools.mem_tracker import MemTracker


@dataclass
class PhasePeak:
    allocated_bytes: int
    reserved_bytes: int | None = None  # CUDA (and sim) only
    breakdown: dict[str, int] = field(default_factory=dict)  # category -> bytes at the peak
    # The peak minus what was live when the phase began: what the phase itself added.
    above_start_bytes: int = 0
    # Other peaks a reader folds (the sim's live tensor bytes), by name.
    extra: dict[str, int] = field(default_factory=dict)

    def entry(self) -> dict[str, int | None]:
        """The Record's ``phases[name]`` entry (the contract's keys)."""
        return {"allocated_bytes": self.allocated_bytes, "above_start_bytes": self.above_start_bytes,
                "reserved_bytes": self.reserved_bytes}


class Probe(Protocol):
    name: str
    phases: dict[str, PhasePeak]
    step_peaks: dict[str, list[int]]
    step_growth: dict[str, list[dict[str, int]]]

    def prepare(self) -> None: ...
    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None: ...
    def phase(self, name: str) -> AbstractContextManager[object]: ...
    def step_phase(self, name: str) -> AbstractContextManager[object]: ...
    def step_begin(self) -> None: ...


# --- phases over one peak counter ---------------------------------------------------------------


@dataclass
class Reading:
    """One look at a memory counter: live bytes now, and the peaks since its last reset."""

    now: int
    peak: int
    reserved_peak: int | None = None
    breakdown: dict[str, int] = field(default_factory=dict)  # at ``peak``, where the counter knows it
    extra: dict[str, int] = field(default_factory=dict)  # further peaks, folded by max
    # The further counters' values now, where a reader has them (the sim's live tensor bytes): what a
    # step phase's growth in ``extra`` is measured from.
    extra_now: dict[str, int] = field(default_factory=dict)


@dataclass
class _Window:
    name: str
    start: int
    peak: int
    reserved: int | None = None
    breakdown: dict[str, int] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)
    extra_start: dict[str, int] = field(default_factory=dict)

    def absorb(self, reading: Reading) -> None:
        if reading.peak >= self.peak:
            self.peak = reading.peak
            self.breakdown = dict(reading.breakdown) or self.breakdown
        if reading.reserved_peak is not None:
            self.reserved = max(self.reserved or 0, reading.reserved_peak)
        for key, value in reading.extra.items():
            self.extra[key] = max(self.extra.get(key, 0), value)


class PhaseRecorder:
    """Nested phases over one resettable peak counter (the CUDA allocator's, MemTracker's, the sim's).

    Every phase boundary first folds the counter's peak into every open phase, then resets it:
    an inner phase (``forward``) gets its own peak and the enclosing one (``train``) still sees the
    largest of all, with no second counter. Per-step phases keep each occurrence's peak in
    ``step_peaks`` and report the largest occurrence in ``phases``; each occurrence's growth above its
    start (``step_growth``: ``allocated_bytes``, and each further counter whose reader says where it
    stood, e.g. the sim's ``live_bytes``) is kept too, where the largest, ``above_start_bytes``, is the
    first optimizer step's, which creates the state: what a later step adds is its temporaries
    (memclaims.techniques.optimizer_impl reads them). Not part of the Record.
    """

    def __init__(self, read: Callable[[], Reading], reset: Callable[[], None]) -> None:
        self.read, self.reset = read, reset
        self.phases: dict[str, PhasePeak] = {}
        self.step_peaks: dict[str, list[int]] = {}
        self.step_growth: dict[str, list[dict[str, int]]] = {}
        self._open: list[_Window] = []

    def _fold(self) -> Reading:
        reading = self.read()
        for window in self._open:
            window.absorb(reading)
        return reading

    @contextmanager
    def measure(self, name: str, per_step: bool = False) -> Iterator[None]:
        beat()  # a rank's progress, for the launcher's limit
        reading = self._fold()
        self.reset()
        window = _Window(name, start=reading.now, peak=reading.now, extra_start=dict(reading.extra_now))
        self._open.append(window)
        try:
            yield
            self._fold()
        finally:
            self._open.remove(window)
            beat()
        peak = PhasePeak(allocated_bytes=window.peak, reserved_bytes=window.reserved,
                         breakdown=window.breakdown, above_start_bytes=window.peak - window.start,
                         extra=window.extra)
        if not per_step:
            self.phases[name] = peak
            return
        self.step_peaks.setdefault(name, []).append(peak.allocated_bytes)
        growth = {"allocated_bytes": peak.above_start_bytes}
        # A further counter's peak is folded from the readings inside the window, or is where it started.
        growth.update({key: max(window.extra.get(key, start), start) - start
                       for key, start in window.extra_start.items()})
        self.step_growth.setdefault(name, []).append(growth)
        previous = self.phases.get(name)
        if previous is None:
            self.phases[name] = peak
            return
        # The largest occurrence, key by key (a phase's biggest growth need not be at its biggest peak).
        if peak.allocated_bytes >= previous.allocated_bytes:
            previous.allocated_bytes, previous.breakdown = peak.allocated_bytes, peak.breakdown
        previous.above_start_bytes = max(previous.above_start_bytes, peak.above_start_bytes)
        if peak.reserved_bytes is not None:
            previous.reserved_bytes = max(previous.reserved_bytes or 0, peak.reserved_bytes)
        for key, value in peak.extra.items():
            previous.extra[key] = max(previous.extra.get(key, 0), value)

    @property
    def active(self) -> bool:
        return bool(self._open)


def phase_entries(phases: dict[str, PhasePeak]) -> dict[str, dict[str, int | None]]:
    """The Record's ``phases``: each phase's absolute peak, peak above its start, reserved peak."""
    return {name: peak.entry() for name, peak in phases.items()}


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
    "Parameter": PARAMETERS,
    "Buffer": BUFFERS,
    "Gradient": GRADIENTS,
    "Optstate": OPTIMIZER_STATE,
    "Activation": ACTIVATIONS,
    "Temp": ACTIVATIONS,
    "Input": ACTIVATIONS,
    "Other": ACTIVATIONS,
}


def _breakdown(snapshot: dict[str, int]) -> dict[str, int]:  # MemTracker's keys: _MemRefType members (typed str)
    result: dict[str, int] = {}
    for key, value in snapshot.items():
        label = getattr(key, "value", key)
        if label == "Total":
            continue
        category = _CATEGORY.get(str(label), ACTIVATIONS)
        result[category] = result.get(category, 0) + int(value)
    return result


class _NoHook:
    """A hook handle with nothing to remove."""

    def remove(self) -> None:
        pass


def _frozen_aware_tracker() -> type[MemTracker]:
    """torch's MemTracker, with changes that leave every byte it counts as it was:

    - a frozen parameter (lora's base weights) gets no gradient hooks: MemTracker installs them on every parameter a
      forward pass meets, and ``register_hook`` refuses a tensor that does not require a gradient. A frozen parameter
      is marked as hooked already; it gets no gradient to track.
    - no per-module statistics: MemTracker copies its whole snapshot into every active module's peak after every op
      and at every module hook (``deepcopy``), which memclaims never reads (it reads the global current and peak
      snapshots only). What the hooks do for the global counts stays: a module's parameters and buffers tracked at
      its first forward (with the gradient hooks), and activation checkpointing's recomputation told apart in
      backward (its tensors are activations, not temporaries). That per-module copying was most of the exact
      accounting's cost per op (issue #50's watch overhead; docs/your-training.md states what remains).

    Its op handler is MemTracker's with the outputs' tensors walked as a flat list (``tree_leaves``, the order
    ``tree_map_only`` visits them) instead of mapped into a new tree that is thrown away; its snapshots are copied
    per device (dicts of ints) instead of by ``deepcopy``.
    """
    from torch._guards import active_fake_mode
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType, _ModState
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    class FrozenAwareTracker(MemTracker):
        def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> tuple[int, int]:
            if install_grad_hooks:
                for param in module.parameters():
                    if not param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                        self._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
            if DTensor in types:  # DTensor desugars into local ops first, which are tracked
                return NotImplemented
            if func is torch.ops._c10d_functional.wait_tensor.default and active_fake_mode():
                result = args[0]  # MemTracker's override of wait_tensor's meta implementation, kept
            else:
                result = func(*args, **(kwargs or {}))
            if active_fake_mode() is self._fake_mode_on_entry:
                if self._in_opt:
                    reftype = _MemRefType.OPT
                elif self._mod_tracker.is_bw and not self._in_ac:
                    reftype = _MemRefType.TEMP
                else:
                    reftype = _MemRefType.ACT
                for leaf in tree_leaves(result):
                    if isinstance(leaf, torch.Tensor):
                        self._track(reftype, leaf)
                self._update_peak_stats(_ModState.PEAK_BW if self._mod_tracker.is_bw else _ModState.PEAK_FW)
            return result

        def _update_peak_stats(self, peak_state: object) -> None:
            # MemTracker's global part only (its per-module part is what this class leaves out).
            for device, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[device] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[device] = dict(snap)  # ints under enum keys: a copy is a deep copy

        def get_tracker_snapshot(self, type: str = "current") -> dict[torch.device, dict[str, int]]:
            # MemTracker's, copied per device instead of by ``deepcopy`` (read at every phase boundary)
            snapshot = {"current": self._curr_mem_snap, "peak": self._peak_mem_snap}.get(type)
            if snapshot is None:
                raise ValueError(f"Invalid type {type}")
            return {device: dict(snap) for device, snap in snapshot.items()}

        def _pre_fw_hook(self, module: nn.Module, inputs: object) -> None:
            if module not in self.memory_tracking:  # MemTracker's first case: the module's states tracked
                self._track_module_params_and_buffers(module, install_grad_hooks=True)
                self.memory_tracking[module] = True  # seen (``reset_mod_stats`` forgets it, as MemTracker's stats)
            elif self._mod_tracker.is_bw and self._ac_mod is None:  # the top module recomputed in backward
                self._ac_mod = weakref.ref(module)
                self._in_ac = True

        def _post_fw_hook(self, module: nn.Module, inputs: object, outputs: object) -> None:
            if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False

        def _pre_bw_hook(self, module: nn.Module, args: object) -> None:
            pass

        def _post_bw_hook(self, module: nn.Module, args: object) -> None:
            pass

    return FrozenAwareTracker


class CpuProbe:
    """Counts every tensor storage alive on the CPU, exactly; deterministic run to run.

    What a GPU's allocated bytes hold from set-up on: a phase after ``track`` counts the model's and the optimizer's
    tensors and every other tensor made by a phase before ``track`` (set-up: ``load``) and still alive (a copy of the
    model a wrapper keeps, a buffer a stack made at set-up), as the CUDA allocator would; what is created inside it is
    counted as it is made. MemTracker counts only what it is given or sees made, so the set-up phase's survivors are
    handed to each later tracker (``_carry``)."""

    name = "cpu-exact"

    def __init__(self) -> None:
        self._tracker_class = _frozen_aware_tracker()
        self._tracker: MemTracker | None = None
        self._recorder = PhaseRecorder(self._read, self._reset_peak)
        self.phases: dict[str, PhasePeak] = self._recorder.phases
        self.step_peaks: dict[str, list[int]] = self._recorder.step_peaks
        self.step_growth: dict[str, list[dict[str, int]]] = self._recorder.step_growth
        # The storages a set-up phase made, held weakly (a storage freed since counts no more).
        self._set_up: list[weakref.ref[torch.UntypedStorage]] = []

    def prepare(self) -> None:
        gc.collect()

    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._tracker = self._tracker_class()
        self._tracker.track_external(*(x for x in (model, optimizer) if x is not None))
        self._carry(self._tracker)

    def _carry(self, tracker: MemTracker) -> None:
        """The set-up's surviving storages that are neither the model's nor the optimizer's, counted by ``tracker``
        as ``Other`` (activations and temporaries in the breakdown: what the model states do not explain)."""
        from torch.distributed._tools.mem_tracker import _MemRefType

        if not self._set_up:  # no set-up phase before (the watch tracks first): nothing to carry, no collection
            return
        gc.collect()  # what only a reference cycle kept is gone
        alive = [storage for ref in self._set_up if (storage := ref()) is not None]
        for storage in alive:
            if storage.nbytes() and storage not in tracker._WINFO:
                # A tensor over the storage (MemTracker tracks tensors): the view goes, the storage stays tracked.
                view = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
                tracker._update_and_maybe_create_winfos(view, _MemRefType.OTH)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        # A phase after ``track`` counts the tracked model states, and the set-up's survivors, from the start; a
        # phase before it (loading) counts what is created inside it, and hands what survives to the later phases.
        tracked = self._tracker is not None
        tracker = self._tracker = self._tracker or self._tracker_class()
        try:
            with tracker, self._recorder.measure(name):
                yield
        finally:
            self._tracker = None
            if not tracked:
                self._set_up += [weakref.ref(storage) for storage in list(tracker._WINFO.keys())]

    def step_phase(self, name: str) -> AbstractContextManager[object]:
        """A phase of a training step, inside ``phase("train")`` (outside a phase nothing is tracked)."""
        return self._recorder.measure(name, per_step=True) if self._recorder.active else nullcontext()

    def step_begin(self) -> None:
        # MemTracker keeps per-module statistics for one forward pass; the global peak survives.
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    # MemTracker offers snapshots but no peak reset; its peak is the pair ``_peak_mem`` /
    # ``_peak_mem_snap`` that ``__enter__`` sets to the current snapshot, and this does the same.
    _CPU = torch.device("cpu")

    def _read(self) -> Reading:
        tracker = self._tracker
        assert tracker is not None  # read inside a phase, which holds a tracker
        now = tracker.get_tracker_snapshot("current").get(self._CPU, {})
        peak = tracker.get_tracker_snapshot("peak").get(self._CPU, {})
        total_now, total_peak = int(now.get("Total", 0)), int(peak.get("Total", 0))
        if total_now > total_peak:  # a peak MemTracker has not folded yet (it updates after each op)
            peak, total_peak = now, total_now
        return Reading(now=total_now, peak=total_peak, breakdown=_breakdown(peak))

    def _reset_peak(self) -> None:
        from copy import deepcopy

        tracker = self._tracker
        assert tracker is not None  # reset inside a phase, which holds a tracker
        current = tracker.get_tracker_snapshot("current")
        tracker._peak_mem_snap = deepcopy(current)
        tracker._peak_mem = {device: snap.get("Total", 0) for device, snap in current.items()}


# --- CUDA: the caching allocator's statistics ---------------------------------------------------


class CudaProbe:
    """Peak allocated and reserved per phase, read from ``torch.cuda``.

    ``cuda`` is injectable so that the arithmetic is tested against faked statistics on machines
    without a GPU; everything CUDA-specific this suite calls goes through it.
    """

    name = "cuda-allocator"

    def __init__(self, cuda: Any = None, history_entries: int | None = None) -> None:
        from memclaims.measure import diagnosis

        self.cuda = cuda if cuda is not None else torch.cuda
        # Allocator events to keep for a memory_viz snapshot on failure (0: off); None: the
        # session's setting (--memclaims-memory-history), since the runner builds the probe.
        # A fake ``cuda`` gets no history unless asked: fakes need not model torch.cuda.memory.
        session_default = diagnosis.history_entries() if cuda is None else 0
        self.history_entries = session_default if history_entries is None else history_entries
        self._recorder = PhaseRecorder(self._read, self._reset_peak)
        self.phases: dict[str, PhasePeak] = self._recorder.phases
        self.step_peaks: dict[str, list[int]] = self._recorder.step_peaks
        self.step_growth: dict[str, list[dict[str, int]]] = self._recorder.step_growth
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
            from memclaims.measure.diagnosis import start_history

            start_history(self.cuda, self.history_entries)

    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._model_states = (model, optimizer)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._recorder.measure(name):
            yield
        peak = self.phases[name]
        if self._model_states is not None:
            states = model_state_bytes(*self._model_states)
            peak.breakdown = {
                PARAMETERS: states["param_bytes"],
                GRADIENTS: states["grad_bytes"],
                OPTIMIZER_STATE: states["optimizer_state_bytes"],
            }
            # The allocator does not label blocks: the rest of the peak is activations and
            # temporaries, derived by subtraction.
            peak.breakdown[ACTIVATIONS] = max(0, peak.allocated_bytes - sum(peak.breakdown.values()))

    def step_phase(self, name: str) -> AbstractContextManager[object]:
        return self._recorder.measure(name, per_step=True)

    def step_begin(self) -> None:
        pass

    def _read(self) -> Reading:
        self.cuda.synchronize()  # the statistics count what queued kernels will allocate
        return Reading(now=int(self.cuda.memory_allocated()), peak=int(self.cuda.max_memory_allocated()),
                       reserved_peak=int(self.cuda.max_memory_reserved()))

    def _reset_peak(self) -> None:
        self.cuda.reset_peak_memory_stats()

    def capture_snapshot(self, recipe_id: str) -> None:
        """The allocator history of this recipe's measured steps, saved now (memclaims.measure.diagnosis)."""
        if self.history_entries > 0:
            from memclaims.measure.diagnosis import capture_snapshot

            self.cuda.synchronize()
            capture_snapshot(self.cuda, recipe_id)


def make_probe(device: str) -> Probe:
    return CudaProbe() if device == "cuda" else CpuProbe()
