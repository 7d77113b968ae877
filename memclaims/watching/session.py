"""``memclaims.watch``: memclaims' probes around the user's own training code, as a context manager.

    with memclaims.watch(model, optimizer) as watched:
        for inputs, targets in loader:          # the user's loop, unchanged
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    record = watched.record                     # a memclaims.core.record.Record

The phases open from hooks (``memclaims.watching.phases``); the probe is memclaims' own (``memclaims.measure.probes``:
exact tensor accounting on the CPU, the caching allocator's statistics on CUDA), inside the same ``load`` and ``train``
phases memclaims' own runs have, with the host memory per step phase (``memclaims.measure.host``). A run in which no
forward, no backward or no optimizer step was seen raises ``PhasesNotSeen`` naming the phase: an empty Record never
passes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.measure import probes as probe_module
from memclaims.measure.host import HostSteps, read_counters
from memclaims.measure.tensors import storage_bytes
from memclaims.watching.phases import EVALUATION, StepPhases
from memclaims.watching.record import WatchedRun, build

if TYPE_CHECKING:
    from memclaims.watching.on_sim import SimProbe

SIM = "sim"  # the device of a watch on the sim's fake tensors (memclaims.watching.on_sim, imported only then)


class PhasesNotSeen(AssertionError):
    """A watched run that never showed a phase every training step has (an AssertionError: a test fails on it)."""


def _device(model: nn.Module, device: str | torch.device | None) -> str:
    if device == SIM:  # the sim is asked for by name only: no tensor lives there before the watch opens
        return SIM
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise UsageError(f"memclaims.watch: device {kind!r} is not measured; memclaims measures 'cpu' (exact tensor "
                         "accounting), 'cuda' (the caching allocator's statistics) and 'sim' (CUDA predicted on fake "
                         "tensors, the model built inside the watch)")
    return kind


def _optimizers(optimizer: object) -> list[torch.optim.Optimizer]:
    """The torch optimizers behind what the user holds: accelerate's ``AcceleratedOptimizer`` and Lightning's
    ``LightningOptimizer`` keep theirs in ``optimizer`` / ``_optimizer``; a list or tuple of them."""
    if optimizer is None:
        return []
    if isinstance(optimizer, (list, tuple)):
        return [inner for each in optimizer for inner in _optimizers(each)]
    held = [optimizer]
    for attribute in ("optimizer", "_optimizer"):
        inner = getattr(optimizer, attribute, None)
        if isinstance(inner, torch.optim.Optimizer):
            held.append(inner)
    return [each for each in held if isinstance(each, torch.optim.Optimizer)]


# The watch open now, if any: one at a time (two would wrap autograd twice and nest two MemTrackers), and one a stack
# left open (a Trainer's train() that raised never calls on_train_end) is closed by ``close_left_open``.
_OPEN: list[Watch] = []


def close_left_open() -> list[str]:
    """Close a watch left open (its hooks removed, no verdict); the names of those closed."""
    closed = []
    while _OPEN:
        left = _OPEN[-1]
        left.__exit__(RuntimeError, RuntimeError("left open"), None)
        closed.append(left.name)
    return closed


def _built(model: object, name: str) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise UsageError(f"memclaims.watch({name}): the function given as model returned {type(model).__name__}, "
                         "not a torch.nn.Module")
    return model


class Watch:
    """The context manager ``memclaims.watch`` returns; ``record`` holds the Record once it has exited."""

    def __init__(self, model: nn.Module | Callable[[], nn.Module], optimizer: object = None, *,
                 device: str | torch.device | None = None, name: str = "watch",
                 probe: probe_module.Probe | None = None, profile: str | None = None) -> None:
        built_here = not isinstance(model, nn.Module)
        if built_here and (isinstance(model, torch.Tensor) or not callable(model)):
            raise UsageError(f"memclaims.watch: model must be a torch.nn.Module or a function that builds one, got "
                             f"{type(model).__name__}")
        self.name = name
        # A builder runs inside the watch, in its load phase; the model exists once the watch has opened.
        self._build: Callable[[], nn.Module] | None = None if isinstance(model, nn.Module) else model
        self.model: nn.Module = model if isinstance(model, nn.Module) else nn.Module()
        self._optimizer = optimizer
        self.device = _device(self.model, device)
        if self.device == SIM and not built_here:
            raise UsageError(f"memclaims.watch({name}) on the sim: give the function that builds the model (the model "
                             "is built inside the watch, on the sim's fake tensors, at full size), not a model built "
                             "already")
        self.sim: SimProbe | None = None
        if self.device == SIM:
            from memclaims.watching.on_sim import SimProbe  # the sim's modules load only for a watch on the sim

            self.sim = SimProbe(profile)
        self.probe: probe_module.Probe = (probe if probe is not None else self.sim if self.sim is not None
                                          else probe_module.make_probe(self.device))
        self.phases: StepPhases | None = None if built_here else self._step_phases()
        # Host counters at each step phase's start and end, without the cyclic collection memclaims' own runs make
        # there: it cost more than a small model's whole step, and the watch judges the device's memory (a leak, a
        # budget, the baseline), not the host's growth. One collection runs when the watch opens (``prepare``).
        self.host_steps = HostSteps(read=partial(read_counters, collect=False))
        self._host = probe_module.HostMemory()
        self._stack = ExitStack()
        self._record: Record | None = None

    def _step_phases(self) -> StepPhases:
        optimizer = self._optimizer
        if callable(optimizer) and not isinstance(optimizer, (torch.optim.Optimizer, list, tuple)):
            optimizer = self._optimizer = optimizer(self.model)  # a function of the model built inside the watch
        return StepPhases(self.model, _optimizers(optimizer), self._phase, self.probe.step_begin,
                          reads_losses=self.device != SIM,
                          count_bytes=self.sim.storage_bytes if self.sim is not None else storage_bytes)

    @property
    def optimizer(self) -> Any:
        """The optimizer given, or the one the watch made with the function given (after the model was built)."""
        return self._optimizer

    def _phase(self, name: str) -> Any:
        if self.sim is not None:  # the sim predicts the device; the host's counters would read the sim's own work
            return self.probe.step_phase(name)
        return self.host_steps.wrap(self.probe.step_phase)(name)

    @property
    def record(self) -> Record:
        if self._record is None:
            raise UsageError("memclaims.watch: the Record exists once the with-block has ended")
        return self._record

    def __enter__(self) -> Watch:
        if _OPEN:
            raise UsageError(f"memclaims.watch({self.name}): the watch {_OPEN[-1].name!r} is still open; one watch at a "
                             "time (end the first with-block, or give one callback to the Trainer)")
        _OPEN.append(self)
        stack = self._stack
        try:
            if self.sim is not None:  # the fake mode first: the model is built in it, and the code runs in it
                stack.enter_context(self.sim.fake())
            phases = self._load()
        except BaseException as error:
            _OPEN.remove(self)
            stack.close()
            refused = self.sim.refusal(self.name, error) if self.sim is not None else None
            if refused is not None:  # the sim's one line for a value read while building
                raise refused from None
            raise
        # The hooks first: torch calls global module hooks in the order they were registered, and a micro-batch's
        # step boundary (MemTracker's per-module statistics reset) must come before MemTracker's own forward hook.
        phases.install()
        stack.callback(phases.remove)
        stack.enter_context(self.probe.phase("train"))
        stack.callback(phases.driver.close)  # the last step phase ends inside train
        return self

    def _load(self) -> StepPhases:
        """The load phase of memclaims' own runs: the model built inside it where a builder was given (what the
        build allocates is counted), else the model as handed over (a phase of no work over its tracked states)."""
        self._host.start()
        probe = self.probe
        probe.prepare()
        if self._build is not None:
            with probe.phase("load"):
                self.model = _built(self._build(), self.name)
            if self.sim is None and _device(self.model, None) != self.device:
                raise UsageError(f"memclaims.watch({self.name}): the model was built on "
                                 f"{_device(self.model, None)!r} but the watch measures {self.device!r}; pass "
                                 f"device={_device(self.model, None)!r} to the watch")
            self.phases = self._step_phases()
        phases = self.phases
        assert phases is not None  # made in __init__ for a model given, above for one built
        optimizers = phases.optimizers
        if self._build is None:
            probe.track(self.model, optimizers[0] if optimizers else None)
            with probe.phase("load"):
                pass
        probe.track(self.model, optimizers[0] if optimizers else None)
        return phases

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            self._stack.close()
        finally:
            if self in _OPEN:
                _OPEN.remove(self)
        refused = self.sim.refusal(self.name, error) if self.sim is not None and error is not None else None
        if refused is not None:  # a value the sim cannot know, bitsandbytes: one line, the fake tensor's error not chained
            raise refused from None
        if isinstance(self.probe, probe_module.CudaProbe):
            self.probe.capture_snapshot(self.name)
        # Evaluation batches are no training step: the leak checks read the steps only.
        self.probe.step_peaks.pop(EVALUATION, None)
        self.probe.step_growth.pop(EVALUATION, None)
        for by_phase in self.host_steps.steps.values():
            by_phase.pop(EVALUATION, None)
        phases = self.phases
        assert phases is not None  # a watch that opened has its phases
        self._record = build(WatchedRun(self.name, self.model, phases), self.model, phases, self.probe,
                             device=self.device, host_peak_bytes=None if self.sim else self._host.peak_bytes(),
                             host_steps={} if self.sim else self.host_steps.steps,
                             sim=self.sim)
        missing = phases.missing()
        if error is None and missing:
            raise PhasesNotSeen(
                f"memclaims.watch({self.name}): no {', no '.join(missing)} was seen in the watched code, so its memory "
                f"was not measured (seen: {dict(phases.seen) or 'nothing'}); train inside the with-block, with "
                "the model and optimizer given to the watch")


class CallbackWatch:
    """What a stack's callback keeps of its watch: opened at training's start, closed at its end, the Record kept
    even when closing raises (phases not seen); TrainerWatch and LightningWatch hold it with their stack's hooks."""

    def __init__(self, name: str = "watch") -> None:
        self.name = name
        self.record: Record | None = None
        self._watch: Watch | None = None

    def _open(self, model: nn.Module, optimizer: object) -> None:
        self._watch = Watch(model, optimizer, name=self.name)
        self._watch.__enter__()

    def _close(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            try:
                watch.__exit__(None, None, None)
            finally:
                self.record = watch._record


def watch(model: nn.Module | Callable[[], nn.Module], optimizer: object = None, *,
          device: str | torch.device | None = None, name: str = "watch", profile: str | None = None) -> Watch:
    """memclaims' per-phase probes around ``model``'s training, as a context manager; ``.record`` after it ends.

    ``model``: the model, or a function that builds it (called as the watch opens, inside its ``load`` phase, so the
    Record's load peak is the build's; the model is then ``.model``). ``optimizer``: the optimizer (or a list of them; accelerate's and Lightning's wrappers are looked through), whose
    state is counted as optimizer state and whose ``zero_grad`` opens that phase; any torch optimizer stepped inside
    is seen either way; with a builder, a function of the model that makes it (``.optimizer``). ``device``: ``"cpu"`` or ``"cuda"``; the model's by default; ``"sim"``: the CUDA
    peaks predicted on fake tensors at full size, without a GPU (``memclaims.watching.on_sim``: the model given as a
    builder; ``profile``: the sim profile, the installed torch's by default). ``name``: the Record's ``recipe``
    (the key its baseline is stored under).
    """
    return Watch(model, optimizer, device=device, name=name, profile=profile)
