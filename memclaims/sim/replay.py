"""The `sim` device: replay a recipe's load and training loop on fake tensors, through the allocator model.

Everything runs under ``FakeTensorMode`` on fake *CPU* tensors (fake CUDA tensors crash in
backward without a GPU, pytorch#92627); the storages created while ``DeviceMemory.counting`` is on
are what a GPU run would hold on the device. What had to be emulated, and why:

- autocast: ``torch.autocast("cuda")`` turns itself off without a GPU, so mixed precision runs under
  ``torch.autocast("cpu")`` with the half dtype. For the ops a ViT uses (linear, conv, matmul and
  SDPA in half; layer norm on an fp32 residual stream, so fp32 either way) the CPU policy casts what
  the CUDA policy casts, and it keeps the same weight-cast cache; the casts run above autograd, so
  the half copies saved for backward are counted.
- attention: the profile names the GPU kernel. The CPU flash kernel's meta implementation stands in
  for flash v2 (same O(L) state, output laid out like the query); ``tracker.DeviceMemory`` adds
  what the others do differently: the (B, L, H, D) output layout of memory-efficient attention and
  flash v1 (one more copy per layer in ``multi_head_attention_forward``), flash v1's reshape copies
  of q, k, v (and the output gradient in backward), flash v2's backward scratch. "math" is forced
  with ``sdpa_kernel``.
- optimizers: built by ``memclaims.measure.optimizers`` and switched to ``foreach=True``, the GPU default
  that fake parameters do not trigger by themselves.
- ``nn.init.trunc_normal_``: today's rejection sampler reads values (``.item()``); the torch 2.1
  in-place algorithm it replaced is used while the model is built.
- ``Module.to()``: moves and conversions are replayed parameter by parameter in ``Module._apply``'s
  order, which is the order a real move allocates in.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map_only

from memclaims.core.errors import OutOfMemory, UsageError
from memclaims.core.optimizer_choices import torch_flags
from memclaims.core.precision import PRECISIONS
from memclaims.core.precision import precision as precision_spec
from memclaims.core.record import GRADIENTS, OPTIMIZER_STATE, PARAMETERS, Record
from memclaims.measure import optimizers
from memclaims.measure.loop import TrainingLoop
from memclaims.measure.probes import PhaseRecorder, Reading
from memclaims.measure.record_builder import SIM_PHASES, build_record, failed_phase
from memclaims.measure.tensors import optimizer_state_tensors
from memclaims.recipes.run_options import memory_steps as resolve_steps
from memclaims.sim.allocator import CachingAllocator, DeviceFull, TraceEvent
from memclaims.sim.eras import optimizer_era
from memclaims.sim.fake_build import naming_the_module, same_mode_copies
from memclaims.sim.known_values import reading_values
from memclaims.sim.profiles import Profile
from memclaims.sim.profiles import profile as find_profile
from memclaims.sim.timeline import GPUS, Clock, last_step_seconds
from memclaims.sim.tracker import DeviceMemory, tracked_fake_mode
from memclaims.techniques import lora as lora_parameters
from memclaims.techniques.base import (
    FABRIC,
    PYTORCH,
    LoadsReference,
    Observed,
    PlacesOnDevice,
    SetsAllocator,
    merge_observed,
    nothing_observed,
)
from memclaims.techniques.impl.peft_adapters_fake import apply as adapt

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe

GRAD_SCALE = 65536.0  # GradScaler's initial scale (16-mixed)
LOAD_MODES = ("build-then-convert", "init-module")
FAKE_DATA = "none (fake tensors)"  # the Record's data: the sim reads no data set


@dataclass(frozen=True)
class PhaseResult:
    allocated_bytes: int  # peak of block bytes, as torch.cuda.max_memory_allocated
    reserved_bytes: int  # peak of segment bytes, as torch.cuda.max_memory_reserved
    live_bytes: int  # peak of live tensor bytes (no rounding, no workspaces, no kernel scratch)

    def as_dict(self) -> dict[str, int]:
        return {"allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
                "live_bytes": self.live_bytes}


@dataclass(frozen=True)
class LoadResult:
    """A model-load-only replay (the 07 scripts)."""

    mode: str
    profile: str
    param_count: int
    param_bytes: int
    peak: PhaseResult


def _storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """``tensors.storage_bytes`` for fake tensors: they have no data pointer, so storages count by identity."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


def _state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = list(model.parameters())
    state = optimizer_state_tensors(optimizer)  # a low-bit state subclass as the tensors behind it
    return {"param_bytes": _storage_bytes(iter(params)),
            "grad_bytes": _storage_bytes(p.grad for p in params if p.grad is not None),
            "optimizer_state_bytes": _storage_bytes(state)}


# --- models ------------------------------------------------------------------------------------


def _trunc_normal_21(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                     b: float = 2.0, generator: Any = None) -> torch.Tensor:
    """torch 2.1's ``nn.init.trunc_normal_``: in place, no temporaries, reads no value."""
    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    with torch.no_grad():
        low, high = cdf((a - mean) / std), cdf((b - mean) / std)
        tensor.uniform_(2 * low - 1, 2 * high - 1, generator=generator)
        tensor.erfinv_().mul_(std * math.sqrt(2.0)).add_(mean).clamp_(min=a, max=b)
    return tensor


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Fabric's ``_DtypeContextManager``: factories default to ``dtype``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def _era_init() -> Iterator[None]:
    original = nn.init.trunc_normal_
    nn.init.trunc_normal_ = _trunc_normal_21
    try:
        yield
    finally:
        nn.init.trunc_normal_ = original


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "xavier_uniform_",
                   "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_")


@contextmanager
def _no_init() -> Iterator[None]:
    """Skip ``nn.init`` while building on the host: values never matter on fake tensors, and time does."""
    originals = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    for name in _INIT_FUNCTIONS:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(nn.init, name, function)


def _vit_fns(family: Any) -> tuple[Callable[[str, int | None], nn.Module],
                                    Callable[[str, int], tuple[torch.Tensor, torch.Tensor]]]:
    """A ViT family's model (no weights are loaded: values do not change memory) and its inputs."""

    def inputs(recipe_scale: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        size = family.image_size(recipe_scale)
        return torch.empty(batch, 3, size, size), torch.zeros(batch, dtype=torch.long)

    return family.architecture, inputs


def _models() -> dict[str, tuple[Callable[[str, int | None], nn.Module],
                                 Callable[[str, int], tuple[torch.Tensor, torch.Tensor]]]]:
    """workload name -> (build(scale name, num_classes or None for the stock head), inputs(scale, batch))"""
    from memclaims.workloads.vit import VIT_FAMILIES

    return {name: _vit_fns(family) for name, family in VIT_FAMILIES.items()}


def _workload_fns(workload: Any) -> tuple[Callable[[Any, int | None], nn.Module],
                                          Callable[[Any, int], tuple[Any, torch.Tensor]]] | None:
    """A workload's own fake-tensor model and inputs (text, hf: and user workloads that give them)."""
    if workload.architecture is None or workload.fake_inputs is None:
        return None
    architecture = workload.architecture

    def build(scale: Any, num_classes: int | None) -> nn.Module:
        with naming_the_module(workload.name):
            made: nn.Module = architecture(scale, num_classes)
        return made

    return build, workload.fake_inputs


def model_fns(recipe: Recipe) -> tuple[Callable[[Any, int | None], nn.Module],
                                         Callable[[Any, int], tuple[Any, torch.Tensor]]]:
    try:
        return _models()[recipe.workload.name]
    except KeyError:
        fns = _workload_fns(recipe.workload)
        if fns is not None:
            return fns
        raise UsageError(
            f"the sim device cannot run workload {recipe.workload.name!r} yet (no fake-tensor model "
            f"for it); simulated workloads: {', '.join(_models())}, the text and hf: workloads, and user "
            "workloads that give an architecture and fake_inputs"
        ) from None


def parameter_count(recipe: Recipe) -> int:
    """The parameters of the model the replay builds for ``recipe``, counted on the meta device: no
    replay, no memory (``memclaims fit`` answers a budget below them at once)."""
    build, _ = model_fns(recipe)
    with torch.device("meta"):
        model = build(recipe.scale, recipe.workload.num_classes)
    return sum(p.numel() for p in model.parameters())


def _apply_order(module: nn.Module) -> Iterator[tuple[dict[str, Any], str]]:
    """(owner dict, name) of every parameter and buffer, in ``Module._apply``'s order."""
    for child in module.children():
        yield from _apply_order(child)
    for store in (module._parameters, module._buffers):
        for name, value in store.items():
            if value is not None:
                yield store, name


def move(module: nn.Module, dtype: torch.dtype | None = None,
          held: Callable[[torch.Tensor], bool] | None = None, placed: frozenset[int] = frozenset()) -> None:
    """``module.to(device)`` or ``.to(dtype)``: each tensor gets a new storage, the old one is dropped; one the
    device ``held`` already (a technique put it there) stays, as ``Module.to`` leaves a tensor on its device, and
    so do those of ``placed`` (the ids of tensors a strategy already put there)."""
    for store, name in _apply_order(module):
        value = store[name]
        if dtype is not None and not value.is_floating_point() or id(value) in placed:
            continue
        if held is not None and held(value):
            continue
        fresh = torch.empty_like(value, dtype=dtype or value.dtype)
        value.data = fresh


# --- the session -------------------------------------------------------------------------------


def with_allocator_settings(chosen: Profile, recipe: Recipe) -> Profile:
    """The profile with the recipe's allocator settings (expandable-segments) in its allocator model."""
    allocator = chosen.allocator
    for hooks in recipe.hooks:
        if isinstance(hooks, SetsAllocator):
            allocator = hooks.sim_allocator(allocator)
    return chosen if allocator == chosen.allocator else dataclasses.replace(chosen, allocator=allocator)


def merged(states: dict[str, object], after: Observed) -> dict[str, object]:
    merged = dict(states)
    merge_observed(merged, after)
    return merged


def observed_after(session: Session, recipe: Recipe) -> Observed:
    """What the allocator model shows of the recipe's techniques once the replay has ended (memclaims.measure.active)."""
    observed = nothing_observed()
    for hooks in recipe.hooks:
        if isinstance(hooks, SetsAllocator):
            merge_observed(observed, hooks.sim_observe_run(session))
    return observed


def tf32_matmul(recipe: Recipe) -> bool:
    """The article's scripts from 02 on call ``torch.set_float32_matmul_precision("high")``; the fp32 rows do not."""
    return recipe.precision != "32-true" and recipe.stack == FABRIC


class Session:
    """One simulated device: a fresh allocator, the tracker, and the fake-tensor mode that feeds it."""

    def __init__(self, profile: Profile, limit_bytes: int | None = None) -> None:
        self.profile = profile
        self.allocator = CachingAllocator(profile.allocator, limit_bytes)
        self.memory = DeviceMemory(self.allocator, profile)
        if profile.timeline:
            self.memory.clock = Clock(GPUS[profile.timing_gpu])
        self.fake = tracked_fake_mode(self.memory)
        # The probes' nested phases over the allocator model's peak counters.
        self.recorder = PhaseRecorder(self._read, self.memory.reset_peaks)

    def _read(self) -> Reading:
        stats = self.allocator.stats
        return Reading(now=stats.allocated, peak=stats.peak_allocated, reserved_peak=stats.peak_reserved,
                       breakdown=dict(self.memory.breakdown_at_peak),
                       extra={"live_bytes": self.memory.peak_tensor_bytes},
                       extra_now={"live_bytes": self.memory.tensor_bytes})

    def step_phase(self, name: str) -> Any:
        """A phase of a training step (``memclaims.measure.loop.STEP_PHASES``, the same boundaries), as the probes measure it."""
        return self.recorder.measure(name, per_step=True)

    @contextmanager
    def active(self) -> Iterator[Session]:
        was_enabled = gc.isenabled()
        # Frees follow reference counts only: a cyclic collection at a random moment would
        # make two runs differ (autograd graphs and fake tensors free by reference count).
        gc.disable()
        try:
            # same_mode_copies: modules that deep-copy a layer (nn.Transformer's) keep it in this mode.
            with _era_init(), self.fake, same_mode_copies():
                yield self
        finally:
            if was_enabled:
                gc.enable()

    @contextmanager
    def phase(self, results: dict[str, PhaseResult], name: str) -> Iterator[None]:
        with self.recorder.measure(name):
            yield
        peak = self.recorder.phases[name]
        results[name] = PhaseResult(peak.allocated_bytes, peak.reserved_bytes or 0, peak.extra.get("live_bytes", 0))

    @contextmanager
    def training(self, workload: str, model: nn.Module) -> Iterator[None]:
        """The training phase: values made from constants only are known (memclaims.sim.known_values), and a
        value the sim cannot know (read from data or parameters) is named in one line."""
        with reading_values(workload, model), self.fake.knowing_values():
            yield

    def data(self, inputs_fn: Callable[[object, int], tuple[object, torch.Tensor]]) -> Callable[[Any, int], tuple[Any, torch.Tensor]]:
        """``inputs_fn`` making its batches with values unknown: a batch is data, whatever it was filled with."""
        def made(scale: object, batch: int) -> tuple[Any, torch.Tensor]:
            with self.fake.knowing_values(False):
                return inputs_fn(scale, batch)

        return made

    @contextmanager
    def host(self) -> Iterator[None]:
        """Work that a GPU run does on the CPU: not device memory, so initial values are skipped too."""
        with self.memory.outside(), _no_init():
            yield


def attention_context(profile: Profile, dtype: torch.dtype) -> Any:
    if profile.kernel(str(dtype).removeprefix("torch.")) == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return nullcontext()


# --- load --------------------------------------------------------------------------------------


def load_recipe_model(session: Session, recipe: Recipe, build: Callable[[object, int | None], nn.Module]) -> nn.Module:
    """The recipe's load phase, as ``runner.FabricEngine.build`` + ``fabric.setup`` do it on a GPU."""
    classes = recipe.workload.num_classes
    spec = PRECISIONS[recipe.precision]
    true_dtype = None if spec.mixed else spec.param_dtype
    if _builds_on_device(recipe):
        # fabric.init_module(): built on the device, in the half dtype for true precisions.
        with default_dtype(true_dtype) if true_dtype else nullcontext():
            return _adapted(recipe, build(recipe.scale, classes))
    with session.host():
        # Fabric converts true precisions on the CPU (convert_module) before moving.
        with default_dtype(true_dtype) if true_dtype else nullcontext():
            model = _adapted(recipe, build(recipe.scale, classes))
    for hooks in recipe.hooks:  # qlora: each base layer quantized on the device as it moves there
        if isinstance(hooks, PlacesOnDevice):
            hooks.sim_before_move(model, recipe)
    move(model, held=session.memory.holds)
    return model


def _builds_on_device(recipe: Recipe) -> bool:
    """Whether a technique builds the model on the device (init-module: fabric.init_module())."""
    return any(hooks.sim_builds_on_device() for hooks in recipe.hooks)


def _adapted(recipe: Recipe, model: nn.Module) -> nn.Module:
    """The model as the recipe's techniques change it as built (the fused loss's head bypass, the lora
    technique's adapters: the real pipeline's order, built, then bypassed and adapted, then set up)."""
    for hooks in recipe.converters:
        with naming_the_module(recipe.workload.name):  # an error in peft's wrap names the module
            model = hooks.sim_adapt(model, recipe, lambda module, dtype: move(module, dtype))
    return model


def _load_only(session: Session, mode: str, scale: Any, num_classes: int | None,
               dtype: torch.dtype, build: Callable[[str, int | None], nn.Module]) -> nn.Module:
    if mode == "init-module":
        with default_dtype(dtype):
            return build(scale, num_classes)
    with session.host():
        model = build(scale, num_classes)
    move(model)  # .to("cuda")
    if dtype != torch.float32:
        move(model, dtype)  # .to(float16): one tensor at a time
    return model


def simulate_load(mode: str, *, profile: str = "article", workload: str = "vit", scale: object = "article",
                  num_classes: int | None = None, precision: str = "16-true", lora: bool = False) -> LoadResult:
    """Replay a model-load-only script on the simulated GPU.

    ``mode``: ``build-then-convert`` (07_01: built on the CPU in fp32, then
    ``.to("cuda").to(dtype)``) or ``init-module`` (07_03: built inside ``fabric.init_module()``).
    ``num_classes=None`` keeps the stock head (1000 classes for ``vit_l_16``, as the 07 scripts).
    ``lora``: the model with the lora technique's adapters (the reference load of an init-module+lora recipe).
    """
    result, _, _ = replay_load(mode, find_profile(profile), workload, scale, num_classes, precision, Session, lora)
    return result


def _adapting(build: Callable[[Any, int | None], nn.Module], workload_name: str) -> Callable[[object, int | None], nn.Module]:
    """``build`` followed by the lora technique's adapters, as the real engines' load puts them on."""
    from memclaims.workloads.registry import workload as find_workload

    work = find_workload(workload_name)

    def adapted(scale: object, num_classes: int | None) -> nn.Module:
        model = build(scale, num_classes)
        with naming_the_module(work.name):
            return adapt(model, work.name, lora_parameters.effective(work, None), False,
                         lambda module, dtype: move(module, dtype))

    return adapted


def replay_load(mode: str, chosen: Profile, workload: str, scale: Any, num_classes: int | None, precision: str,
                 session_of: Callable[[Profile], Session], lora: bool = False) -> tuple[LoadResult, Session, int]:
    """``simulate_load``'s replay in a session ``session_of`` opens; also the session and the parameter tensors."""
    if mode not in LOAD_MODES:
        raise UsageError(f"unknown load mode {mode!r}; valid modes: {', '.join(LOAD_MODES)}")
    dtype = precision_spec(precision).param_dtype
    try:
        build, _ = _models()[workload]
    except KeyError:
        from memclaims.workloads.registry import workload as find_workload

        found = find_workload(workload)
        fns = _workload_fns(found)
        if fns is None:
            raise UsageError(f"the sim device cannot load workload {workload!r}; simulated workloads: "
                             f"{', '.join(_models())} and the text and hf: workloads") from None
        build = fns[0]
        scale = found.scale(scale) if isinstance(scale, str) else scale
    if lora:
        build = _adapting(build, workload)
    session = session_of(chosen)
    results: dict[str, PhaseResult] = {}
    with session.active():
        with session.phase(results, "load"):
            model = _load_only(session, mode, scale, num_classes, dtype, build)
        params = list(model.parameters())
        count, tensors = sum(p.numel() for p in params), len(params)
        param_bytes = _storage_bytes(iter(params))
        del model, params
    return (LoadResult(mode=mode, profile=chosen.name, param_count=count, param_bytes=param_bytes,
                       peak=results["load"]), session, tensors)


def load_mode(recipe: Recipe) -> str:
    """The 07 script whose load a load-only replay of ``recipe`` is: 07_03 (init-module) or 07_01."""
    return "init-module" if _builds_on_device(recipe) else "build-then-convert"


# --- train -------------------------------------------------------------------------------------


class SimPrecision:
    """What Fabric's precision plugin does around the forward pass and backward, on fake tensors
    (``core.precision.Precision``: the input cast, autocast, the output cast)."""

    def __init__(self, recipe: Recipe) -> None:
        self.name = "32-true" if recipe.stack == PYTORCH else recipe.precision
        self.spec = PRECISIONS[self.name]
        self.compute = self.spec.compute_dtype
        self.scale: torch.Tensor | None = None

    def convert_input(self, inputs: object) -> Any:
        """Each floating tensor of a batch (a tensor, or a mapping, tuple or list of them: Lightning's
        ``apply_to_collection``) in the plugin's input dtype."""
        dtype = self.spec.input_dtype()
        if dtype is None:
            return inputs
        return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, inputs)

    def forward_context(self) -> Any:
        if self.spec.autocast_dtype is not None:
            from memclaims.sim.autocast import cuda_autocast

            return cuda_autocast(self.spec.autocast_dtype)
        if self.spec.true_half:
            return default_dtype(self.compute)
        return nullcontext()

    def convert_output(self, output: torch.Tensor) -> torch.Tensor:
        return output.to(torch.get_default_dtype()) if self.spec.casts_output else output

    def backward(self, loss: torch.Tensor) -> None:
        if self.name == "16-mixed":  # GradScaler: the scale lives on the device
            if self.scale is None:
                self.scale = torch.full((), GRAD_SCALE)
            loss = loss * self.scale
        loss.backward()


class _SimLoop(TrainingLoop):
    """``memclaims.measure.loop``'s training loop on fake tensors, with what the replay adds to it.

    The article's scripts keep ``logits`` bound until the next forward pass reassigns it, so the
    loop keeps them too; a fake loss has no value to read; the optimizer step runs in the
    profile's optimizer era, its temporaries attributed to it, and its state tagged afterwards.
    """

    def __init__(self, session: Session, recipe: Recipe) -> None:
        super().__init__(recipe.accumulation_steps, recipe.loop_order)  # the stack's order (the scripts' by default)
        self.session, self.recipe = session, recipe
        self.precision = SimPrecision(recipe)
        self.attention = attention_context(session.profile, self.precision.compute)
        self.logits: torch.Tensor | None = None
        self.step_ends: list[float] = []  # the timeline's time after each optimizer step
        for hooks in recipe.hooks:  # activation-offload's saved-tensor hooks, the fused loss, on fake tensors
            hooks.sim_attach(self, session)

    def forward_loss(self, model: nn.Module, inputs: object, targets: torch.Tensor) -> torch.Tensor:
        with self.attention:
            if self.recipe.stack == PYTORCH:
                self.logits = self.recipe.workload.logits(model, inputs)
            else:
                x = self.precision.convert_input(inputs)
                with self.precision.forward_context():
                    out = self.recipe.workload.logits(model, x)
                del x
                self.logits = self.precision.convert_output(out)
                del out
        loss = self.technique_loss(model, self.logits, targets)  # fused-linear-ce's, from the hidden states
        loss = loss if loss is not None else F.cross_entropy(self.logits, targets)
        if not self.order.keeps_output:  # a stack whose loss function returns the loss alone (the HF Trainer's)
            self.logits = None
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def clip(self, model: nn.Module) -> None:
        # A GPU's default: the foreach norms (one scalar per gradient, then their norm) and the in-place scaling.
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.order.max_grad_norm, foreach=True)

    def watch_loss(self, loss: torch.Tensor) -> None:
        loss.detach().float()  # the real loop reads the value (.item()): a temporary at most
        self.session.memory.synchronize()  # ... and so waits for the GPU

    def synchronize(self) -> None:
        clock = self.session.memory.clock
        if clock is not None:
            self.step_ends.append(clock.synchronize())

    def storage_bytes(self, tensors: Iterator[torch.Tensor]) -> int:
        return _storage_bytes(tensors)

    def step(self, optimizer: Any) -> None:
        memory = self.session.memory
        memory.in_optimizer = True
        # Optimizer states are values made from gradients: none is known. A state an optimizer makes with a
        # factory (torchao's torch.zeros codes and scales) would otherwise carry real values, and every op of
        # its quantization would run for real on the host (13.9 GB of RSS for a ViT-L/16 AdamW8bit replay).
        with optimizer_era(self.session.profile.optimizer_era), self.session.fake.knowing_values(False):
            optimizer.step()
        memory.in_optimizer = False

    def after_step(self, optimizer: Any) -> None:
        for value in optimizer_state_tensors(optimizer):
            self.session.memory.tag(value, OPTIMIZER_STATE)


def _optimizer(recipe: Recipe, model: nn.Module, memory: DeviceMemory) -> tuple[torch.optim.Optimizer, Any]:
    if recipe.optimizer in optimizers.EIGHT_BIT:
        from memclaims.core.optim_state import eight_bit_layout
        from memclaims.sim.eight_bit import build as build_eight_bit

        # The layout was read outside the fake mode (simulate): it runs bitsandbytes for real.
        layout = eight_bit_layout()
        if recipe.scale.min_8bit_size is not None:  # the scale's own threshold, as the real optimizer gets it
            layout = dataclasses.replace(layout, min_8bit_size=recipe.scale.min_8bit_size)
        return build_eight_bit(recipe.optimizer, model, recipe.learning_rate, layout, memory.outside), None
    optimizer, scheduler = optimizers.build(recipe.optimizer, model, recipe.learning_rate, 1000,
                                            implementation=recipe.optimizer_impl, owner=recipe.optimizer_owner,
                                            min_8bit_size=recipe.scale.min_8bit_size)  # torchao's, as the real one
    if recipe.optimizer_impl is None:  # torch's default for the device: on CUDA foreach
        for group in optimizer.param_groups:
            group["foreach"] = True  # fake parameters would take the single-tensor path
    return optimizer, scheduler


def implementation_notes(recipe: Recipe, chosen: Profile) -> list[str]:
    """Which implementation of the optimizer step the replay runs, where the recipe chose one (else, as before the
    choice existed, foreach: torch's default on CUDA, with no note)."""
    if recipe.optimizer_impl is None:
        return []
    flags = ", ".join(f"{k}={v}" for k, v in torch_flags(recipe.optimizer_impl).items())
    era = ("the installed torch's" if recipe.optimizer_impl != "foreach" or chosen.optimizer_era == "installed"
           else f"the {chosen.optimizer_era} era's (memclaims.sim.eras)")
    return [f"optimizer step: {recipe.optimizer_impl} ({flags}), {era} {recipe.optimizer} step on fake tensors"]


def train(session: Session, recipe: Recipe, model: nn.Module, memory_steps: int,
           inputs_fn: Callable[[object, int], tuple[object, torch.Tensor]]) -> dict[str, Any]:
    """The measured steps of the real engines' loop, on fake tensors; the Record's state fields."""
    memory = session.memory
    optimizer, scheduler = _optimizer(recipe, model, memory)
    for p in model.parameters():
        memory.tag(p, PARAMETERS)
        if p.requires_grad:  # lora's frozen base weights get no gradient (and take no hook)
            p.register_post_accumulate_grad_hook(lambda param: memory.tag(param.grad, GRADIENTS))
    loop = _SimLoop(session, recipe)
    for hooks in recipe.hooks:  # optimizer-in-backward, after the tagging hooks
        hooks.sim_before_train(loop, optimizer)
    # Each batch is made while the previous one is still bound, as a loader's next batch is moved
    # to the device; one more than the steps need, as the loop stops at the last step.
    batches = (inputs_fn(recipe.scale, recipe.micro_batch_size)
               for _ in range(memory_steps * recipe.accumulation_steps + 1))
    loop.train(model, optimizer, scheduler, batches, memory_steps, phase=session.step_phase)
    states: dict[str, Any] = dict(_state_bytes(model, optimizer))
    states["grad_bytes"] = loop.grad_bytes or 0
    states.update(loop.measured_fields())
    states["predicted_step_s"] = last_step_seconds(loop.step_ends)
    for hooks in recipe.hooks:  # paged state in unified memory, the adapted model's parameters
        merge_observed(states, hooks.sim_observe(model, optimizer, session))
    loop.logits = None
    return states


@contextmanager
def out_of_memory(recipe: Recipe, chosen: Profile, limit_bytes: int | None,
                   phases: dict[str, PhaseResult]) -> Iterator[None]:
    """The allocator model's DeviceFull as the runner reports a GPU's: OutOfMemory naming the phase."""
    try:
        yield
    except DeviceFull as full:
        phase = failed_phase(phases, SIM_PHASES)
        raise OutOfMemory(recipe.id, f"sim ({chosen.gpu}, allocator limited to {limit_bytes} B)", phase,
                          full.requested, str(full)) from None


def allocator_notes(site: dict[str, object], session: Session) -> list[str]:
    """What set the reserved peak (``site``: the allocator's record of it), then the limit's notes."""
    notes = []
    if site:
        where = "in the optimizer step" if site["in_optimizer_step"] else "outside the optimizer step"
        notes.append(f"reserved peak set {where} by {site['op']} (a {site['request_bytes']} B request took "
                     f"reserved memory to {site['reserved_bytes']} B)")
    return notes + limit_notes(session)


def limit_notes(session: Session) -> list[str]:
    allocator = session.allocator
    if allocator.limit_bytes is None:
        return []
    stats = allocator.stats
    if not stats.alloc_retries:
        return [f"allocator limited to {allocator.limit_bytes} B: never reached"]
    return [f"allocator limited to {allocator.limit_bytes} B: {stats.alloc_retries} time(s) a new segment did not "
            f"fit, and the allocator freed {stats.segments_released} wholly free cached segment(s) and retried, "
            "as torch's release_cached_blocks does (each a device synchronisation: slower steps)"]


# Optimizers the sim replays: torch's on fake tensors; bitsandbytes' 8-bit ones (whose kernels read
# real data, SIMULATION.md point 8) by their state layout, memclaims.sim.eight_bit; and those a technique builds itself
# (``BuildsOptimizer``: torchao's low-bit ones, on fake tensors, eagerly: memclaims.techniques.torchao_adamw).
SIM_OPTIMIZERS = ("adam", "sgd", "adamw", "adafactor", *optimizers.EIGHT_BIT)


def readable_eight_bit_layout() -> Any:
    """The installed bitsandbytes' 8-bit layout (read on real CPU tensors), or UsageError with the reason."""
    from memclaims.core.optim_state import eight_bit_layout

    try:
        return eight_bit_layout()
    except Exception as error:  # ImportError, or a bitsandbytes whose init_state changed shape
        raise UsageError(f"the sim device cannot model 8-bit optimizers here: bitsandbytes' layout is "
                         f"unreadable ({type(error).__name__}: {error})") from None




def check_techniques(recipe: Recipe) -> None:
    """Raise UsageError, with the reason, for a technique, optimizer or precision of ``recipe`` the sim cannot replay
    (its model and its strategy's replay are checked before, by ``memclaims.sim.replays.check``)."""
    for hooks in recipe.hooks:  # a technique the sim cannot replay (qlora; ZeRO-2 beyond its accounting)
        reason = hooks.sim_refusal(recipe)
        if reason:
            raise UsageError(f"the sim device cannot run {recipe.id}: {reason}")
    if recipe.optimizer not in SIM_OPTIMIZERS and recipe.optimizer_owner is None:
        raise UsageError(f"the sim device cannot run {recipe.id}: optimizer {recipe.optimizer!r} does not run "
                         f"on fake tensors; simulated optimizers: {', '.join(SIM_OPTIMIZERS)} and those a technique "
                         "builds itself (torchao's)")
    if recipe.optimizer in optimizers.EIGHT_BIT:
        readable_eight_bit_layout()
    if recipe.precision not in PRECISIONS:
        raise UsageError(f"the sim device cannot run precision {recipe.precision!r}; "
                         f"simulated precisions: {', '.join(PRECISIONS)}")


# --- what every replay of a training run shares: its request, its opening notes, its Record ----------------


@dataclass(frozen=True)
class ReplayRequest:
    """What ``memclaims.sim.replays.simulate`` asks a replay for (its arguments, the profile resolved)."""

    profile: Profile  # with the recipe's allocator settings (``with_allocator_settings``)
    memory_steps: int | None = None  # None: the recipe's own (memclaims.recipes.run_options.memory_steps)
    allocator_events: list[TraceEvent] | None = None  # receives the allocator model's history
    limit_bytes: int | None = None  # what the allocator can get from the device; None: unlimited
    devices: int | None = None  # the ranks of a recipe with a strategy (rank 0 is replayed); None: the replay's own


class Replay:
    """One of the sim's replays of a training run (a module of ``memclaims.sim.replays`` each), named by a strategy's
    ``sim_replay`` (its import path, ``"module:Class"``): how it runs a recipe, and what it refuses before that."""

    def check(self, recipe: Recipe) -> None:
        """Raise UsageError, with the reason, for a recipe the replay cannot model; the default refuses nothing."""

    def run(self, recipe: Recipe, request: ReplayRequest) -> Record:
        """Rank 0 (or the one device) of ``recipe``'s run, as a Record."""
        raise NotImplementedError(type(self).__name__)


def opening(recipe: Recipe, request: ReplayRequest) -> tuple[int, list[str]]:
    """The measured steps of a training replay and its first notes (the profile, a single step's caveat)."""
    chosen = request.profile
    steps = resolve_steps(recipe, request.memory_steps, "sim")
    notes = [f"sim profile {chosen.name!r}: {chosen.summary}"]
    if chosen.library_eras:  # the installed releases are the Record's versions; older ones are said (issue #53)
        notes.append("releases replayed: " + ", ".join(f"{lib} {rel}" for lib, rel in chosen.releases().items()))
    if steps < 2:
        notes.append("one optimizer step only: the peak of the second step (gradients and optimizer "
                     "state alive during the forward) is not reached")
    return steps, notes


def sim_record(recipe: Recipe, session: Session, *, memory_steps: int, param_count: int, param_tensor_count: int,
               notes: list[str], observed: dict[str, Any], precision: str | None = None, **more: Any) -> Record:
    """The Record of a replay in ``session``: the one builder's (memclaims.measure.record_builder), with the sim's
    device, probe and phases (the same phases entries as every engine's: the contract's keys, and live_bytes for load
    and train) and the never-reset reserved peak (the article's figure)."""
    chosen = session.profile
    return build_record(
        recipe, device="sim", device_name=f"simulated {chosen.gpu}", probe=f"sim:{chosen.name}",
        precision=precision or recipe.precision, memory_steps=memory_steps, param_count=param_count,
        param_tensor_count=param_tensor_count, phases=session.recorder.phases, step_peaks=session.recorder.step_peaks,
        peak_reserved_total_bytes=session.allocator.stats.reserved_high_water, weights="random", data=FAKE_DATA,
        notes=notes, observed=observed, **more,
    )


def trained_record(recipe: Recipe, session: Session, site: dict[str, Any], *, steps: int, model_counts: tuple[int, int],
                   notes: list[str], states: dict[str, Any], **more: Any) -> Record:
    """The Record of a training replay: what set its reserved peak (``site``) and the limit's notes after its own, its
    state fields with what the techniques observe once it has ended; ``model_counts``: (parameters, tensors)."""
    notes.extend(allocator_notes(site, session))
    return sim_record(recipe, session, memory_steps=steps, param_count=model_counts[0],
                      param_tensor_count=model_counts[1], notes=notes,
                      observed=merged(states, observed_after(session, recipe)), **more)


def reference_load_peak(recipe: Recipe, chosen: Profile) -> int | None:
    """The peak of the reference load a technique asks for before the recipe's (init-module: 07_01's), or None."""
    reference = None
    for hooks in recipe.hooks:
        asked = hooks.sim_reference(recipe) if isinstance(hooks, LoadsReference) else None
        if asked is not None:
            reference = simulate_load(**asked, profile=chosen.name)
    return reference.peak.allocated_bytes if reference else None


def model_counts(model: nn.Module) -> tuple[int, int]:
    """(parameters, parameter tensors) of ``model``, as every engine's Record counts them."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), len(params)
