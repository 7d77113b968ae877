"""The watch on the sim (``memclaims.watch(build, make_optimizer, device="sim")``): the user's own training code runs as
it is, on the sim's fake tensors, and the allocator model predicts its CUDA peaks at full size without a GPU.

The model is built inside the watch, under the sim's fake mode (``memclaims.sim.replay.Session``): its tensors are
counted as device memory from the start (as a model built on the GPU, ``init_module``'s load). Then everything the
with-block does on tensors runs there too: the user's batches, forward, loss, backward, clipping, the torch optimizer's
step. What a fake tensor cannot do is met in one of two ways, never silently:

- a value read from a tensor (``.item()``, ``bool()``, ``int()``, ``float()``, ``.tolist()``) at one of the places
  of ``STAND_INS``, where a library reads a value that only seeds, logs or filters what is logged and never changes
  what is allocated, gets that place's stand-in value; each stand-in used is said in the Record's notes;
- any other value read gets one line (``UsageError``) naming the op and the file:line that read it: the sim cannot
  know what a value computed from data or parameters steers;
- a real tensor made before the watch (a batch) meeting the fake ones gets one line too: a GPU run would copy it to
  the device, which the sim would not count; the batches are made inside the watch, as the model is.

bitsandbytes' 8-bit optimizers read real data (as they are built, and in their kernels): a watch on the sim names
bitsandbytes in its one line (memclaims' own sim cases replay them by their state layout, ``memclaims run ... -t
adam8bit --device sim``), never stepping memclaims' emulation in the user's optimizer's place. ``Module.to`` to the
device the model is already on (the Trainer's ``model.to(args.device)``) keeps the fake tensors where they are: torch's
own ``_apply`` cannot swap a fake parameter that the sim tracks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.overrides import TorchFunctionMode

from memclaims.core.errors import UsageError
from memclaims.core.names import INSTALLED_TORCH_PROFILE
from memclaims.core.record import GRADIENTS, OPTIMIZER_STATE, PARAMETERS
from memclaims.measure.probes import PhasePeak
from memclaims.measure.tensors import optimizer_state_tensors
from memclaims.sim.profiles import profile as find_profile
from memclaims.sim.replay import Session

# The methods that turn a tensor into a Python value, and the type each must return.
_READS: dict[Callable[..., object], type] = {torch.Tensor.item: float, torch.Tensor.__bool__: bool, torch.Tensor.__int__: int,
                           torch.Tensor.__float__: float, torch.Tensor.__index__: int}


@dataclass(frozen=True)
class StandIn:
    """A place where a library reads a tensor's value that changes no allocation, and the value the sim gives it."""

    file: str  # the end of the reading frame's file name
    function: str  # the reading frame's function
    what: str  # what the value is, for the Record's note
    value: float | bool  # for a scalar read; a ``.tolist()`` there gets ``0, 1, 2, ...`` (an order: the data's own)


# Each place found by running transformers' Trainer (5.x) on fake tensors; a new release that reads a value elsewhere
# gets the one-line error naming it, and a line here once it is known to change no allocation.
STAND_INS = (
    StandIn("torch/utils/data/dataloader.py", "__init__", "the DataLoader's base seed for its workers", 0),
    # RandomSampler's seed (.item()) and its permutation (.tolist(): the identity, the data set's own order; any order
    # of the same rows batches the same rows, and a batch's shapes come from its rows).
    StandIn("torch/utils/data/sampler.py", "__iter__", "RandomSampler's seed and order (the data set's own)", 0),
    StandIn("transformers/trainer.py", "_run_epoch",
            "the Trainer's NaN/inf filter of the logged loss (logging_nan_inf_filter): the loss taken as finite", False),
    StandIn("transformers/trainer.py", "_finalize_training", "the Trainer's logged training loss", 0.0),
    StandIn("transformers/trainer.py", "_maybe_log_save_evaluate", "the Trainer's logged loss and gradient norm", 0.0),
)


def _caller() -> FrameType | None:
    """The innermost frame outside this module and torch's dispatch of the read."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or "/torch/overrides.py" in frame.f_code.co_filename
                                 or "/torch/_tensor.py" in frame.f_code.co_filename):
        frame = frame.f_back
    return frame


class ValueReads(TorchFunctionMode):
    """Answers a value read at a place of ``STAND_INS`` with its stand-in; remembers what it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.used: dict[str, str] = {}  # what -> file:line, the first time

    def __torch_function__(self, func: Callable[..., object], types: object, args: Any = (),  # forwarded to func
                           kwargs: dict[str, object] | None = None) -> object:
        kind = _READS.get(func)
        if kind is not None and _is_fake(args[0] if args else None):
            answered, value = self.answer(args[0], kind, _caller())
            if answered:
                return value
        return func(*args, **(kwargs or {}))

    def answer(self, tensor: torch.Tensor, kind: type, frame: FrameType | None) -> tuple[bool, object]:
        """(True, the stand-in) where ``frame`` is a place of ``STAND_INS``; (False, None) elsewhere."""
        if frame is None:
            return False, None
        name = frame.f_code.co_filename
        for stand_in in STAND_INS:
            if name.endswith(stand_in.file) and frame.f_code.co_name == stand_in.function:
                self.used.setdefault(stand_in.what, f"{_short(name)}:{frame.f_lineno}")
                return True, list(range(int(tensor.numel()))) if kind is list else kind(stand_in.value)
        return False, None

    @contextmanager
    def tolist(self) -> Iterator[None]:
        """``tolist`` answered too: ``FakeTensor`` defines its own, which no torch-function mode sees (so it is
        wrapped, on that class, while the watch is open)."""
        from torch._subclasses.fake_tensor import FakeTensor

        original = FakeTensor.tolist

        def tolist(tensor: FakeTensor) -> object:
            answered, value = self.answer(tensor, list, sys._getframe(1))
            return value if answered else original(tensor)

        with mock.patch.object(FakeTensor, "tolist", tolist):
            yield

    def notes(self) -> list[str]:
        return [f"value read on fake tensors, stood in for: {what} at {where}" for what, where in self.used.items()]


def _is_fake(value: object) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def _short(filename: str) -> str:
    """A file name from its package down (``transformers/trainer.py``), or as it is outside site-packages."""
    marker = "site-packages/"
    return filename.split(marker, 1)[1] if marker in filename else filename


# FakeTensorMode's assertion where a real tensor meets fake ones (the sim allows none: it would count no device copy).
_REAL_MEETS_FAKE = "Please convert all Tensors to FakeTensors first"
_DISPATCH = ("/memclaims/", "/torch/_", "/torch/overrides.py", "/torch/utils/_")


def _reader(error: BaseException) -> str:
    """file:line of the code that read the value (the innermost frame of ``error`` outside memclaims and torch's
    dispatch), and, where that is torch's own code, the innermost frame outside torch that called it."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if not any(part in f.filename for part in _DISPATCH)]
    if not frames:
        return "an unknown place"
    reader = f"{_short(frames[-1].filename)}:{frames[-1].lineno}"
    if "/torch/" not in frames[-1].filename:
        return reader
    outside = [f for f in frames if "/torch/" not in f.filename]
    return f"{reader} (called from {_short(outside[-1].filename)}:{outside[-1].lineno})" if outside else reader


_WHAT_READS = {"_local_scalar_dense": ".item(), bool(), int(), float() or an if on a tensor",
               "nonzero": "nonzero(), boolean-mask indexing or torch.where with one argument"}


_EIGHT_BIT_ADVICE = ("predict it with memclaims' own sim case (memclaims run <workload> -t adam8bit --device sim, its "
                     "state replayed from bitsandbytes' layout) or watch this code on device='cpu' or 'cuda'")


def value_error(name: str, error: BaseException) -> UsageError:
    """The one line for a value the sim cannot know: the op, the file:line that read it, what to do; bitsandbytes
    (which reads values as it builds its optimizers' quantization maps) named as what does not run on the sim."""
    import traceback

    inside = [f for f in traceback.extract_tb(error.__traceback__) if "/bitsandbytes/" in f.filename]
    if inside:
        return UsageError(f"memclaims.watch({name}) on the sim: bitsandbytes does not run on fake tensors (its "
                          f"kernels read real data; {_reader(error)}); {_EIGHT_BIT_ADVICE}")
    func = getattr(error, "func", None)
    op = str(func) if func is not None else type(error).__name__
    how = next((words for key, words in _WHAT_READS.items() if key in op), "a value of a tensor")
    return UsageError(f"memclaims.watch({name}) on the sim: {_reader(error)} reads a tensor's value ({op}: {how}), "
                      "which fake tensors do not have; read values outside the watched steps, or watch this code on "
                      "device='cpu' or 'cuda'")


def fake_storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind fake tensors, by identity (a fake storage has no data pointer; the
    sim's replays count them so too)."""
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


class SimProbe:
    """The watch's probe on the sim: the Session's phase recorder over the allocator model (``memclaims.measure.probes``'
    ``Probe`` protocol), the model's states tagged in the allocator model's categories as the sim's replays tag them."""

    def __init__(self, profile: str | None = None) -> None:
        self.session = Session(find_profile(profile or INSTALLED_TORCH_PROFILE))
        self.name = f"sim:{self.session.profile.name}"
        recorder = self.session.recorder  # its dicts, filled as the phases end
        self.phases: dict[str, PhasePeak] = recorder.phases
        self.step_peaks: dict[str, list[int]] = recorder.step_peaks
        self.step_growth: dict[str, list[dict[str, int]]] = recorder.step_growth
        self.reads = ValueReads()
        self.foreach: set[str] = set()  # the optimizers stepped with foreach=True as on a GPU (``_stepping``)
        self._hooked: set[int] = set()

    @staticmethod
    def storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
        return fake_storage_bytes(tensors)

    def prepare(self) -> None:
        """Nothing to collect: frees follow reference counts on the sim (``Session.active`` turns collection off)."""

    def phase(self, name: str) -> AbstractContextManager[object]:
        return self.session.recorder.measure(name)

    def step_phase(self, name: str) -> Any:  # Session.step_phase's (memclaims/sim, not typed here)
        return self.session.step_phase(name)

    def step_begin(self) -> None:
        """No per-forward state to reset (the allocator model keeps none per module)."""

    def track(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """The parameters tagged, and their gradients as they are made (the optimizers' state: ``_stepping``)."""
        memory = self.session.memory
        for parameter in model.parameters():
            memory.tag(parameter, PARAMETERS)
            if parameter.requires_grad and id(parameter) not in self._hooked:
                parameter.register_post_accumulate_grad_hook(lambda p: memory.tag(p.grad, GRADIENTS))
                self._hooked.add(id(parameter))

    def _stepping(self) -> Iterator[None]:
        """torch.optim's global step hooks, for every optimizer the watched code steps (the Trainer makes its own inside
        ``train()``): torch's left to choose its implementation stepped as on a
        GPU (``foreach``, which fake parameters would not pick by themselves; said in the notes); the state tagged."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        memory = self.session.memory

        def before(optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            for group in optimizer.param_groups:
                if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                    group["foreach"] = True
                    self.foreach.add(type(optimizer).__name__)

        def after(optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            for value in optimizer_state_tensors(optimizer):
                memory.tag(value, OPTIMIZER_STATE)

        handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def notes(self) -> list[str]:
        chosen = self.session.profile
        return [f"sim profile {chosen.name!r}: {chosen.summary}",
                *(f"optimizer step: {name} with foreach=True, torch's default on CUDA" for name in sorted(self.foreach)),
                *self.reads.notes()]

    @staticmethod
    def refusal(name: str, error: BaseException) -> UsageError | None:
        """The one line for ``error`` where it is a value the sim cannot know (read by the watched code or by
        bitsandbytes); None for any other error (the watched code's own, raised as it is)."""
        if isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
            return value_error(name, error)
        if isinstance(error, AssertionError) and str(error).startswith(_REAL_MEETS_FAKE):
            op = str(error).split("Found in ", 1)[-1].split("(", 1)[0]
            return UsageError(f"memclaims.watch({name}) on the sim: {_reader(error)} gives {op} a tensor made before "
                              "the watch (a real one, which the sim does not count as device memory) with the fake "
                              "ones; make the batches inside the watch, as the model is")
        return None

    @contextmanager
    def fake(self) -> Iterator[None]:
        """The sim's fake mode around the watched code: fake tensors, the stand-ins, ``Module.to`` kept in place."""
        with ExitStack() as stack:
            stack.enter_context(self.session.active())
            stack.enter_context(_kept_in_place())
            stack.enter_context(contextmanager(self._stepping)())
            stack.enter_context(self.reads)
            stack.enter_context(self.reads.tolist())
            yield


def _same_device(module: nn.Module, args: Any, kwargs: Any) -> bool:
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    first = next(module.parameters(), None)
    here = first.device if first is not None else torch.device("cpu")
    return dtype is None and (device is None or device.type == here.type)


@contextmanager
def _kept_in_place() -> Iterator[None]:
    """``Module.to`` to the device the module is on returns it as it is (what a real same-device ``to`` leaves)."""
    original: Callable[..., nn.Module] = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:  # forwarded as Module.to takes them
        return self if _same_device(self, args, kwargs) else original(self, *args, **kwargs)

    with mock.patch.object(nn.Module, "to", to):
        yield
