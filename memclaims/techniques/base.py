"""What a technique is (``Technique``, its registry entry) and what it does (``Hooks``, called by the engines).

A technique's module (``memclaims/techniques/<name>.py``) defines both: ``ENTRY = Technique(..., hooks=...)``.
The engines call the hooks of the recipe's techniques (``Recipe.hooks``, registry order) at fixed points
and never ask which technique a recipe has: every hook's default does nothing, so a technique overrides
only the points it changes. The points, by engine:

- the real run on one device (``memclaims.measure.pipeline``, ``memclaims.measure.runner``):
  ``refusal`` (before anything runs), ``attach`` (the loop's helpers), ``init_context`` (around the model's build), ``convert_module`` (after the build, by
  ``convert_order``), ``reference_module`` (07_01's reference model), ``before_setup`` (the optimizer before Fabric wraps it), ``observe`` (the Record's fields of
  what it did, after the measured steps);
- the active check (``memclaims.measure.active``): ``check``; the case test (``memclaims.pytest.cases``):
  ``compare_without``, ``expected_grad_bytes``, ``expected_param_bytes``, ``accuracy_reported_only``;
- the sim (``memclaims.sim.replay``): ``sim_refusal``, ``sim_builds_on_device``, ``sim_attach``, ``sim_adapt`` (by
  ``convert_order``), ``sim_after_load``, ``sim_before_train``, ``sim_observe``;
- narrow protocols, implemented only by the techniques that need them and found by ``isinstance`` on the recipe's
  hooks: ``SetsAllocator`` (``run_context``, ``sim_allocator``, ``sim_observe_run``: expandable-segments),
  ``LoadsReference`` (``reference_load``, ``sim_reference``: init-module), ``PlacesOnDevice`` (``sim_before_move``:
  qlora), ``JudgesParameterBytes`` (qlora), ``BuildsOptimizer`` (torchao's optimizers), ``SetsUpOptions``
  (``setup_options``: cpu-offload), ``ChecksRanks`` (``rank_check``: DDP);
- a run on ranks (``memclaims.measure.distributed``, the sim's strategy replays): ``rank_refusal``, and
  ``plan_strategy``, how a technique that combines with a strategy changes what the ranks execute (the
  ``StrategyPlan``, which the strategy itself, a ``Strategy``, makes);
- what reports read of a technique: ``unsupported_on`` (memclaims.recipes.requirements), ``load_only``
  (memclaims.report.fit's time cost), ``stored_bits`` (fit's parameter floor), ``stand_in`` and ``removes`` (memclaims.report.series: a published bar
  run where the technique cannot run as published, and the chain's floor).

A strategy (``fsdp``, ``ddp``, ...) is a technique whose hooks are a ``Strategy``: the object the multi-rank
engines ask how to run the recipe on ranks (Lightning's ``Strategy``, torchtitan's ``parallelize_fn``), as
the one-device engines ask ``Hooks``.

Nothing here imports torch or the engines: the registry loads before the plugin's preflight has looked at the
stack. A hook imports the helpers it drives (``memclaims.techniques.impl.peft_adapters``, ``memclaims.techniques.impl.peft_adapters_fake``, ...)
when it is called, inside the engine that calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NewType, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from typing import Self

    import torch
    from _typeshed import DataclassInstance
    from lightning.fabric.strategies import Strategy as FabricStrategy
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions
    from memclaims.techniques.engine_protocols import FabricRun, PhaseProbe, RealRun, SimLoop, SimSession
    from memclaims.workloads.types import Workload

# Precision names are Lightning Fabric's own ``precision=`` strings.
FP32 = "32-true"
TRUE_HALF_PRECISIONS = ("16-true", "bf16-true")

Say = Callable[[str], None]  # an active check's complaint, prefixed with the technique's name by the caller

# Which FSDP ran (the Record's ``fsdp_api``, a StrategyPlan's): FSDP1's FullyShardedDataParallel (one FlatParameter
# per wrapped unit; Lightning's FSDPStrategy), FSDP2's fully_shard (per-parameter dim-0 DTensor shards).
FSDP1_API = "fsdp1"
FSDP2_API = "fsdp2"
# Where a StrategyPlan's notes are written: the CPU ranks' own sharded engine (memclaims.measure.distributed),
# the sim's replays of a strategy (memclaims.sim.replay).
ON_CPU_RANKS = "cpu ranks"
ON_SIM = "sim"


class Hooks:
    """What a technique does to a run, at the engines' fixed points; each default changes nothing."""

    # Where ``convert_module`` and ``sim_adapt`` run among the recipe's techniques (lower first, then registry
    # order): checkpointing wraps the blocks as built, the fused loss bypasses the head, then the adapters go on.
    convert_order = 1

    # --- the real run, one device ------------------------------------------------------------------

    def refusal(self, recipe: Recipe, options: RunOptions) -> str | None:
        """Why ``recipe`` cannot run on ``options.device`` (a UsageError's text), or None."""
        return None

    def attach(self, engine: RealRun) -> None:
        """Put the technique's helpers on the engine's training loop (``engine``: a ``pipeline.Engine``)."""

    def init_context(self, engine: FabricRun) -> AbstractContextManager[object] | None:
        """A context the model is built inside (Fabric's ``init_module``); None: built as the workload builds it."""
        return None

    def convert_module(self, model: nn.Module, engine: RealRun) -> nn.Module:
        """The model after the build, in the load phase, before the optimizer sees its parameters."""
        return model

    def reference_module(self, model: nn.Module, workload: Workload) -> nn.Module:
        """07_01's reference model (built in fp32, then converted) as this technique changes the recipe's."""
        return model

    def before_setup(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The model and optimizer before ``setup`` (Fabric's wrappers are no optimizer to copy)."""

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        """What the technique did, read right after the measured steps: its part of the Record,
        ``{"by_technique": {ENTRY.name: {...}}}`` (``observations``); never a flat field (issue #51)."""
        return nothing_observed()

    # --- the active check and the case test -----------------------------------------------------------

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """``say`` what ``record`` does not show of the technique's effect; ``without``: the same recipe's Record
        without it, where ``compare_without`` asks for one."""

    def compare_without(self) -> bool:
        """Whether the check compares with the recipe without this technique (its effect shows only so)."""
        return False

    def expected_grad_bytes(self, record: Record, bytes_per_param: int, expected: int) -> int:
        """The gradient bytes the case expects after a backward, given what the other techniques expect."""
        return expected

    def expected_param_bytes(self, record: Record, bytes_per_param: int, expected: int) -> int:
        """The parameter bytes the case expects, given what the other techniques expect (``param_count`` x the
        precision's bytes by default): a technique that stores some parameters in another dtype says so."""
        return expected

    def accuracy_reported_only(self, record: Record) -> bool:
        """Whether the case reports the accuracy rather than asserting it learned."""
        return False

    # --- the sim ----------------------------------------------------------------------------------------

    def sim_refusal(self, recipe: Recipe) -> str | None:
        """Why the sim cannot replay the technique (a UsageError's reason), or None."""
        return None

    def sim_builds_on_device(self) -> bool:
        """Whether the model is built on the device (``init_module``) rather than on the host and moved."""
        return False

    def sim_attach(self, loop: SimLoop, session: SimSession) -> None:
        """Put the technique's fake-tensor helpers on the sim's loop (``session``: the replay's session)."""

    def sim_adapt(self, model: nn.Module, recipe: Recipe, move: Callable[[nn.Module, torch.dtype | None], None]) -> nn.Module:
        """The fake model as built, before it is moved to the device (by ``convert_order``)."""
        return model

    def sim_after_load(self, model: nn.Module, recipe: Recipe, notes: list[str]) -> None:
        """The fake model after the load, in the load phase."""

    def sim_before_train(self, loop: SimLoop, optimizer: torch.optim.Optimizer) -> None:
        """The sim's loop and optimizer before the measured steps."""

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer, session: SimSession) -> Observed:
        """The technique's part of the Record (``observations``) of what it did on the sim, right after the measured
        steps."""
        return nothing_observed()

    # --- a run on ranks ---------------------------------------------------------------------------------

    def rank_refusal(self, recipe: Recipe, device: str, world: int) -> str | None:
        """Why ``recipe`` cannot run on ``world`` ranks of ``device`` (a UsageError's text), or None."""
        return None

    def plan_strategy(self, plan: StrategyPlan) -> StrategyPlan:
        """What the recipe's ranks execute, as this technique changes its strategy's plan (checkpointing, offload,
        the notes of what it does on each engine). Called on every technique of the recipe, in registry order."""
        return plan

    # --- what reports read ----------------------------------------------------------------------------

    def unsupported_on(self, device: str) -> str | None:
        """Why no run on ``device`` (cpu, cuda) can have the technique, whatever the recipe; None: it can."""
        return None

    def load_only(self) -> bool:
        """Whether the technique changes the model's load only: the training steps run as without it."""
        return False

    def stand_in(self, workload: Workload, device: str) -> StandIn | None:
        """How a bar of a published series (memclaims.report.series) with this technique runs on ``device``
        where it cannot run as published; None: as published."""
        return None

    def stored_bits(self) -> int | None:
        """The fewest bits the technique stores a parameter in, where fewer than any precision's dtype (qlora's
        4-bit base: 4); None: as its recipe's precision stores it (memclaims.report.fit's parameter floor)."""
        return None

    def removes(self, after: Record) -> Removal | None:
        """What the technique, added to the bar before, can remove at most of a peak (the article's chain
        arithmetic, memclaims.report.series); ``after``: the bar's Record. None: nothing of its own."""
        return None


NO_HOOKS = Hooks()

# The sim profile's allocator model (``memclaims.sim.profiles.AllocatorConfig``) as an allocator setting changes it.
AllocatorSetting = TypeVar("AllocatorSetting", bound="DataclassInstance")


# --- narrow protocols: a point only the techniques that need it implement; the engines find it with isinstance -----


@runtime_checkable
class SetsAllocator(Protocol):
    """A setting of the CUDA caching allocator (expandable-segments): around a real CUDA run, in the sim's allocator
    model, and what that model shows once the replay has ended."""

    def run_context(self, recipe: Recipe, options: RunOptions,
                    cuda: object) -> AbstractContextManager[object] | None:
        """A context around the whole run (the allocator setting); None: none on ``options.device``."""
        ...

    def sim_allocator(self, allocator: AllocatorSetting) -> AllocatorSetting:
        """The profile's allocator model (``memclaims.sim.profiles.AllocatorConfig``) under the setting."""
        ...

    def sim_observe_run(self, session: SimSession) -> Observed:
        """The Record's fields of what the setting did on the sim, read once the replay has ended."""
        ...


@runtime_checkable
class LoadsReference(Protocol):
    """A technique measured against a reference load before the recipe's own (init-module: 07_01's)."""

    def reference_load(self, engine: FabricRun, probe: PhaseProbe) -> int | None:
        """The reference load on a real run (``engine``: the pipeline's engine): its peak; None: none."""
        ...

    def sim_reference(self, recipe: Recipe) -> dict[str, Any] | None:
        """The arguments of the reference load the sim replays (``memclaims.sim.replay.simulate_load``'s, but the
        profile); None: none."""
        ...


@runtime_checkable
class PlacesOnDevice(Protocol):
    """A technique that puts part of the model on the device itself before the setup moves it (qlora's 4-bit base,
    quantized as each layer moves)."""

    def sim_before_move(self, model: nn.Module, recipe: Recipe) -> None:
        """The fake model as built and adapted on the host, before the move: what the technique places on the device
        first (the device counts it; the move leaves it where it is)."""
        ...


@runtime_checkable
class SetsUpOptions(Protocol):
    """A technique that changes how Fabric's ``setup`` treats the model (cpu-offload: FSDP moves what it needs)."""

    def setup_options(self) -> dict[str, object]:
        """Keyword arguments of Fabric's ``setup``."""
        ...


@runtime_checkable
class ChecksRanks(Protocol):
    """A technique whose effect only the ranks of one run together show (DDP: all-reduced gradients, bit for bit the
    same on every rank)."""

    def rank_check(self, records: Sequence[Record]) -> list[str]:
        """What the ranks' Records do not show of it, one line each."""
        ...


@runtime_checkable
class JudgesParameterBytes(Protocol):
    """A technique that stores some parameters in a dtype of its own (qlora's 4-bit base), whose own ``check`` judges
    the Record's parameter bytes: the active check of the precision (memclaims.measure.active) leaves them to it."""

    def judges_parameter_bytes(self, record: Record) -> bool:
        """Whether ``record``'s parameter bytes are this technique's to judge (it stored parameters its own way)."""
        ...


@runtime_checkable
class BuildsOptimizer(Protocol):
    """A technique whose module builds the recipe's optimizer itself (torchao's low-bit AdamWs): the engines' optimizer
    builder (memclaims.measure.optimizers) asks the recipe's techniques for this protocol (``Recipe.optimizer_owner``)
    where the optimizer is none of the core field's own (torch's, bitsandbytes', transformers' Adafactor)."""

    def build_optimizer(self, groups: list[dict[str, object]], learning_rate: float, betas: tuple[float, float],
                        eps: float, min_8bit_size: int | None, device: str) -> torch.optim.Optimizer:
        """The optimizer over the course's parameter groups, with the course's AdamW arguments."""
        ...


@dataclass(frozen=True)
class StandIn:
    """A published bar on a device that cannot run one of its techniques as published (``Hooks.stand_in``)."""

    said: str  # what differs from the published run, in words
    dropped: bool = False  # the bar runs without the technique
    # Why the bar does not run at all where dropping the technique leaves the bar before's recipe.
    refused: str = ""


@dataclass(frozen=True)
class Removal:
    """What a technique removes at most of a peak (``Hooks.removes``): factors of the bar before's model state
    (parameters, gradients, optimizer state) and of the rest (activations, temporaries), and why."""

    state: float = 1.0
    rest: float = 1.0
    why: str = ""
    no_verdict: str | None = None  # why the bar gets no verdict at all (FSDP over one device shards nothing)
    # The phase where what it removes lives, where the run's peak may lie in another phase it does not touch
    # (checkpointing: the forward's activations, under a smoke-scale rank's fp32 optimizer step): there the bar
    # holds when that phase falls and the peak does not rise.
    phase: str | None = None


@dataclass(frozen=True)
class StrategyPlan:
    """What the ranks of a recipe execute: its strategy's configuration (``Strategy.plan``) as the recipe's other
    techniques change it (``Hooks.plan_strategy``), for ``world`` ranks. The engines execute it: the CPU ranks'
    sharded engine (``fully_shard`` over gloo, memclaims.measure.distributed), the sim's strategy replays
    (memclaims.sim.replay); on Lightning's ranks the strategy builds Lightning's own object from it
    (``Strategy.lightning_strategy``). Plain data: every field is torch's or Lightning's own setting."""

    world: int
    # Which FSDP the plan runs (FSDP1_API, FSDP2_API; a Lightning rank's Record says it); None: no FSDP.
    fsdp_api: str | None = None
    # FSDP1's ShardingStrategy (FSDPStrategy's sharding_strategy); FSDP2 runs it as reshard_after_forward
    # and a (replicate, shard) device mesh.
    sharding_strategy: str = "FULL_SHARD"
    reshard_after_forward: bool = True  # FSDP2's fully_shard on each block (the root keeps FSDP2's own default)
    # The device mesh the ranks form where the plan needs one (HSDP's (replicate, shard)); None: one dimension.
    mesh_shape: tuple[int, ...] | None = None
    mesh_dim_names: tuple[str, ...] = ()
    # The ranks that train on different data (tensor parallelism's ranks of one group share each batch: its mesh's
    # data-parallel size); None: every rank has its own share.
    data_parallel: int | None = None
    wrap_blocks: bool = False  # one unit (FSDP1) or fully_shard group (FSDP2) per workload block, then the root
    checkpoint_blocks: bool = False  # activation checkpointing of each block (non-reentrant, inside its unit)
    offload_params: bool = False  # FSDP's CPUOffload(offload_params=True): shards and their state on the host
    # Whether Fabric's setup moves the model to the device before the strategy wraps it (FSDPStrategy), or each
    # shard moves itself (ModelParallelStrategy's module_to_device is a no-op; offload keeps the model on the host).
    setup_moves_model: bool = True
    # Whether FSDP's collectives run in the dtypes of Lightning's precision plugin's MixedPrecision (FSDPPrecision,
    # FSDP1), or in the parameters' own dtype (FSDP2 as memclaims applies it: no MixedPrecisionPolicy).
    mixed_precision_policy: bool = False
    # DDP's Reducer: gradients all-reduced from flat buckets of torch's default caps beside the parameters' .grad.
    bucket_gradients: bool = False
    # What Lightning's strategy object and its precision plugin configure for the plan (``Strategy.configured``: for
    # FSDP, ``FSDPStrategy`` paired with ``FSDPPrecision`` as Fabric's connector pairs them, read without launching
    # them), for the engines that execute FSDP where Lightning does not (the CPU ranks, the sim). Empty: memclaims' own
    # plan. The MixedPrecision Lightning passes to FSDP, by torch dtype name ("bfloat16"; None: the parameters' own) and
    # its input casts; the auto-wrap policy (torch's ``_Policy``, e.g. the ``ModuleWrapPolicy`` Lightning builds from
    # a set of classes; None: the root alone); the keywords of Lightning's activation checkpointing
    # (``apply_activation_checkpointing``'s ``auto_wrap_policy`` or ``check_fn``; empty: none); who configured them.
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    buffer_dtype: str | None = None
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True
    wrap_policy: object = None
    checkpoint_options: tuple[tuple[str, object], ...] = ()
    configured_by: str = ""
    notes: tuple[tuple[str, str], ...] = ()  # (where: ON_CPU_RANKS, ON_SIM; the note), in the order written

    def mesh_size(self, dim: str) -> int:
        """The size of the device mesh's dimension named ``dim`` (``mesh_dim_names``)."""
        assert self.mesh_shape is not None, f"the plan has no device mesh to name {dim!r} in"
        return self.mesh_shape[self.mesh_dim_names.index(dim)]

    def notes_on(self, where: str) -> list[str]:
        """The notes the engine ``where`` writes of the plan."""
        return [note for on, note in self.notes if on == where]

    def noted(self, where: str, note: str) -> StrategyPlan:
        """The plan with one more note for the engine ``where``."""
        return replace(self, notes=(*self.notes, (where, note)))


class Strategy(Hooks):
    """A technique that runs the recipe on several ranks: what the multi-rank engines ask of it (Lightning's
    ``Strategy``, torchtitan's ``parallelize_fn``), beside the ``Hooks`` every technique has.

    - ``plan``: its ``StrategyPlan`` for a recipe on ``world`` ranks (``Recipe.strategy_plan`` adds the other
      techniques' ``plan_strategy``);
    - on Lightning's ranks (``lightning_devices``): ``lightning_strategy``, Fabric's ``strategy=``; elsewhere the
      CPU ranks' sharded engine executes the plan as that object configures it (``configured``; the sim too) and
      calls ``parallelize`` on the model with the plan's mesh, as Lightning's ``ModelParallelStrategy`` calls its
      ``parallelize_fn``;
    - ``rank_notes``: what a rank's Record says ran; ``sim_replay``: which of the sim's replays runs it.
    """

    # The devices whose ranks run the strategy through Lightning's own (``lightning_strategy``).
    lightning_devices: tuple[str, ...] = ("cuda", "cpu")
    # The sim's replay of a rank, by import path (a ``memclaims.sim.replay.Replay`` of memclaims.sim.replays, found by
    # ``memclaims.sim.replays.replay_of``, imported only when the sim runs it): by default the one-device replay, with
    # the plan's buckets and notes (DDP's); FSDP's "sharded", ZeRO-2's "zero", tensor parallelism's own.
    sim_replay = "memclaims.sim.replays.one_device:OneDeviceReplay"
    # Whether the strategy decides where a rank's parameters live (FSDP's shards, offload): a one-device load is
    # not a rank's, and no parameter floor holds.
    shards_parameters = False
    # Whether the strategy wraps the workload's blocks itself and checkpoints them by its own policy (FSDP's
    # auto-wrap and activation_checkpointing_policy); else a one-device engine wraps them.
    block_policies = False
    # Whether Lightning's strategy replaces the model's parameters at setup (ModelParallelStrategy's parallelize_fn:
    # torch's parallelize_module registers a DTensor parameter in place of each split weight), so that an optimizer
    # made before setup, as the article's scripts make it, must follow its parameters to their replacements.
    replaces_parameters = False

    def plan(self, recipe: Recipe, world: int) -> StrategyPlan:
        """Its own configuration for ``recipe`` on ``world`` ranks, before the other techniques change it."""
        return StrategyPlan(world=world)

    def lightning_strategy(self, plan: StrategyPlan, recipe: Recipe, device: str) -> str | FabricStrategy:
        """Lightning Fabric's ``strategy=`` (an object or its name) for a rank on ``device``."""
        raise NotImplementedError(f"{type(self).__name__} runs on Lightning's ranks only where it says so")

    def parallelize(self, plan: StrategyPlan, model: nn.Module, mesh: DeviceMesh | None, workload: Workload) -> nn.Module:
        """The model as one of the CPU ranks' sharded engine holds it (``mesh``: the plan's device mesh, or None)."""
        raise NotImplementedError(f"{type(self).__name__} has no engine of its own on the CPU ranks")

    def configured(self, plan: StrategyPlan, recipe: Recipe, precision: str) -> StrategyPlan:
        """The plan as Lightning's own strategy object (``lightning_strategy``) and its precision plugin for
        ``precision`` configure it, for the engines that execute the strategy where Lightning does not run it (the
        CPU ranks, the sim): what they execute, so that a change in Lightning's layer changes what they run. The
        default: the plan as it is (a strategy Lightning runs wherever memclaims runs it, or one whose configuration
        is memclaims' own)."""
        return plan

    def rank_notes(self, plan: StrategyPlan, rank: int, device: str) -> list[str]:
        """What rank ``rank`` on ``device`` says ran (the first notes of its Record)."""
        return []


# The training stacks (the ``loop`` group's techniques; ``Recipe.stack``): Lightning Fabric, the reference, runs a recipe
# that names none; plain PyTorch is script 01's loop; the others are stacks that run the loop themselves (``Stack``).
FABRIC = "fabric"
PYTORCH = "pytorch"

# Where a training loop zeroes the gradients (``LoopOrder.zero_grad``), which decides whether the previous step's
# gradients are alive during the next forward pass:
# - the article's scripts (and memclaims' Fabric and plain PyTorch loop): after the forward pass without
#   accumulation (01-04, 06), after the optimizer step with it (05);
ZERO_AS_SCRIPTS = "scripts"
# - right after every optimizer step (the HF Trainer's ``model.zero_grad()``, the course's Accelerate loop);
ZERO_AFTER_STEP = "after-step"
# - after the forward pass of the first micro-batch of each accumulation window, inside the closure (Lightning's
#   automatic optimization, lightning.pytorch.loops.optimization.automatic).
ZERO_AT_WINDOW_START = "window-start"
ZERO_GRAD_PLACES = (ZERO_AS_SCRIPTS, ZERO_AFTER_STEP, ZERO_AT_WINDOW_START)
# The step phase of the gradient norm (and clipping) a stack runs between the last backward and the step.
CLIP_GRAD_NORM = "clip_grad_norm"
@dataclass(frozen=True)
class LoopOrder:
    """The order a stack's training loop runs a step in: what the real stacks do (their drivers observe it) and what
    the sim's replay of the same loop (memclaims.measure.loop.TrainingLoop) runs. Plain data."""

    zero_grad: str = ZERO_AS_SCRIPTS
    # The gradient norm computed (and the gradients clipped to ``max_grad_norm``) after the last backward of a step:
    # the HF Trainer's ``_clip_grad_norm`` (``max_grad_norm=1.0`` by default; without it, the norm alone).
    clips_gradients: bool = False
    max_grad_norm: float = 1.0
    # All micro-batches of a step fetched before its first forward (the HF Trainer's ``get_batch_samples``).
    prefetches: bool = False
    # The model's output stays bound until the next forward (the scripts' ``logits``, the course's ``outputs``);
    # False: it is a local of a function that returns the loss (the HF Trainer's compute_loss, Lightning's training_step).
    keeps_output: bool = True

    def gradients_in_forward(self, accumulation_steps: int) -> bool:
        """Whether the previous step's gradients are still alive during the first forward of a step (after the first):
        the loop zeroes them only after that forward (the scripts without accumulation, Lightning's window start)."""
        return self.zero_grad == ZERO_AT_WINDOW_START or self.zero_grad == ZERO_AS_SCRIPTS and accumulation_steps == 1

    def step_phases(self, accumulation_steps: int) -> list[str]:
        """The step phases of one optimizer step after the first, in the order the loop runs them."""
        micro = ["forward", "backward"] * accumulation_steps
        clip = [CLIP_GRAD_NORM] if self.clips_gradients else []
        if self.zero_grad == ZERO_AS_SCRIPTS and accumulation_steps == 1 or self.zero_grad == ZERO_AT_WINDOW_START:
            return ["forward", "zero_grad", *micro[1:], *clip, "optimizer_step"]
        return [*micro, *clip, "optimizer_step", "zero_grad"]


@runtime_checkable
class StackRun(Protocol):
    """A real run by a training stack's driver (``memclaims.measure.stacks.stack_driver.StackDriver``); a stack's
    ``observe`` tells it from the other engines by this protocol."""

    @property
    def observed(self) -> Mapping[str, object]:
        """What the driver observed of the stack's loop: the stack's part of the Record."""
        ...


class Stack(Hooks):
    """A training stack that runs the recipe's loop itself (the HF Trainer, Accelerate, Lightning's Trainer), beside the
    ``Hooks`` every technique has: the door (memclaims.run) runs it on its engine (``engine``, a module of
    memclaims.measure.stacks), which expresses the recipe through the stack's own switches and drives the probes from
    the stack's callbacks; the sim replays the stack's ``loop_order`` (and what ``sim_before_train`` sets of its
    optimizer)."""

    # The stack's technique name: its Record part (``by_technique[name]``) holds what its driver observed.
    name = ""
    # The stack's driver, the engine half that runs it (a ``memclaims.measure.stacks.stack_driver.StackDriver``), by its
    # import path ``"module:Class"``: found by ``memclaims.measure.stacks.driver_class``, imported only when it runs.
    driver = ""
    # Whether the stack checkpoints the workload's blocks by its own switch (the HF Trainer's), so that the
    # activation-checkpointing technique does not wrap them a second time.
    checkpoints_blocks = False
    # The techniques the stack expresses through its own switches (precision, batch, accumulation, optimizer, ...). The
    # ones it cannot are refused as the entry's conflicts, each with its reason; a technique registered after the stack
    # and in neither list is refused by ``refusal`` and ``sim_refusal``, before anything runs, never dropped.
    expresses: frozenset[str] = frozenset()

    def loop_order(self, recipe: Recipe) -> LoopOrder:
        """The order the stack runs a step of ``recipe`` in."""
        return LoopOrder()

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        """What the stack's driver observed of the run (its switches, what it stepped), as the stack's Record part."""
        assert isinstance(engine, StackRun), f"{self.name} runs by its own driver only"
        return observations(self.name, **engine.observed)

    def unexpressed(self, recipe: Recipe) -> str | None:
        """Why the stack cannot run ``recipe``: a technique it does not express; None: it expresses them all."""
        stray = [name for name in recipe.techniques if name != recipe.stack and name not in self.expresses]
        if not stray:
            return None
        return (f"{recipe.stack!r} does not combine with {stray[0]!r}: the stack expresses only "
                f"{', '.join(sorted(self.expresses))} through its own switches")

    def refusal(self, recipe: Recipe, options: RunOptions) -> str | None:
        return self.unexpressed(recipe)

    def sim_refusal(self, recipe: Recipe) -> str | None:
        return self.unexpressed(recipe)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """What every stack's Record shows of its loop (its driver observes it in ``by_technique``): a step's phases in
        the order of the stack's ``loop_order``, and the previous step's gradients alive during the next forward or
        not, as that order says. The sim runs the declared order itself: nothing to observe there."""
        if record.device == "sim":
            return
        order = self.loop_order(recipe)
        expected = order.step_phases(recipe.accumulation_steps)
        if record.observed(recipe.stack, "step_phases") != expected:
            say(f"a step ran its phases in the order {record.observed(recipe.stack, 'step_phases')}, expected {expected} (the stack's "
                f"loop order: zero_grad {order.zero_grad})")
        alive = order.gradients_in_forward(recipe.accumulation_steps)
        if record.observed(recipe.stack, "gradients_in_forward") != alive:
            say(f"the previous step's gradients were {'alive' if record.observed(recipe.stack, 'gradients_in_forward') else 'freed'} in "
                f"phase forward, expected {'alive' if alive else 'freed'} (zero_grad {order.zero_grad})")


# A technique's observations as the Record keeps them, ``{"by_technique": {technique: {key: value}}}`` (or nothing): what
# ``observe``, ``sim_observe``, ``sim_observe_run`` and a loop helper's ``measured_fields`` return. A NewType so that
# only ``observations`` makes one: a part built by hand is no ``Observed`` to mypy, and every part follows one rule
# for a value the technique did not observe.
Observed = NewType("Observed", dict[str, dict[str, dict[str, object]]])


def observations(technique: str, **values: object) -> Observed:
    """``values`` as ``technique``'s part of the Record, ``{"by_technique": {technique: {...}}}``; nothing at all where
    there is no value. A None is kept: "observed, and there was none" (optimizer-impl's ``step_temporary_bytes`` where
    one step was measured, tensor-parallel's forward counts without a watch), as the stored Records hold it; the Record
    itself drops it under the keys it kept flat until issue #51, where None meant "not observed" (``Record``'s
    ``__post_init__``, beside the migration that reads those keys' old form)."""
    return Observed({"by_technique": {technique: dict(values)}} if values else {})


def nothing_observed() -> Observed:
    """A hook's ``observe`` where the technique observes nothing (a fresh one: a caller may merge into it)."""
    return Observed({})


def merge_observed(into: dict[str, Any], observed: Observed) -> None:
    """Add a hook's observations to the Record's fields (``into``), technique by technique (two parts of one technique,
    e.g. lora's and qlora's own observe, merged key by key)."""
    for technique, part in observed.get("by_technique", {}).items():
        parts = into.setdefault("by_technique", {})
        parts[technique] = {**parts.get(technique, {}), **part}


class LoopHelper:
    """What a technique puts on one run's training loop (``TrainingLoop.helpers``, from ``Hooks.attach``,
    ``Hooks.sim_attach`` or ``Hooks.before_setup``): the loop calls each helper at its fixed points, and the
    hooks object, shared by every run, keeps no state of its own. Each default changes nothing."""

    def forward_context(self) -> AbstractContextManager[object] | None:
        """A context around each forward pass (saved-tensor hooks); None: none."""
        return None

    def loss(self, model: nn.Module, output: object, targets: object) -> torch.Tensor | None:
        """The micro-batch's loss from the model's output, in place of cross-entropy over it; None: that."""
        return None

    def compute_dtypes(self, seen: list[str]) -> list[str]:
        """The dtypes the first forward pass computed in, given those its linear layers' outputs had."""
        return seen

    def measured_fields(self) -> Observed:
        """The technique's part of the Record (``observations``) of what the helper saw over the measured steps."""
        return nothing_observed()


class TechniqueParameters(Protocol):
    """The values a technique takes beyond its name (``Technique.parameters``: lora's ``LoraParameters``), a frozen class
    whose default instance is the workload's defaults."""

    @classmethod
    def parse(cls, text: str) -> Self:
        """The values a recipe id's ``name[k=v,...]`` gives (``text``: ``k=v,...``)."""
        ...

    def suffix(self) -> str:
        """``parse``'s inverse: the id's ``[k=v,...]``, empty for the defaults."""
        ...

    def options(self) -> str:
        """The command-line options that ask for these values."""
        ...

    def described(self, workload: Workload) -> str:
        """What the technique runs with on ``workload``, the defaults included, in words."""
        ...

    def beyond(self, workload: Workload) -> Self:
        """Only what differs from ``workload``'s defaults."""
        ...


@dataclass(frozen=True)
class Technique:
    """A technique's registry entry: what it is, what it sets of the recipe's core fields, how it combines."""

    name: str
    summary: str
    source: str  # the article script (row) it comes from
    group: str | None = None  # at most one technique per group in a recipe
    # The recipe's core fields a technique may set (memclaims/techniques/__init__.py: why these stay fields).
    precision: str | None = None
    batch_divisor: int = 1
    accumulates: bool = False  # micro-batches of the scale's accumulation count
    optimizer: str | None = None
    # How torch steps the optimizer (memclaims.techniques.optimizer_impl: "for-loop", "foreach", "fused");
    # None: torch's own default for the device.
    optimizer_impl: str | None = None
    # The training stack that runs the recipe's loop (``Recipe.stack``): a ``loop`` technique's name (``pytorch``,
    # ``hf-trainer``, ...); None: Lightning Fabric, the reference (``FABRIC``).
    stack: str | None = None
    alone: bool = False  # a whole recipe by itself; combines with nothing
    requires: frozenset[str] = field(default_factory=frozenset)  # capabilities, e.g. "bitsandbytes"
    needs: frozenset[str] = field(default_factory=frozenset)  # other techniques it builds on
    # The technique whose computation this one repeats exactly (the same kernels on the same data;
    # only where memory lives differs): the reference for an allocator setting, adamw8bit for its paged
    # variant. A recipe of such techniques alone trains no accuracy phase: its accuracy is the one of
    # the recipe with these in their place (memclaims.recipes.run_options.evaluates). None: its own numerics.
    computes_as: str | None = None
    # A technique only some workloads take: (the Workload attribute a workload sets to take it, why the
    # others cannot). memclaims.recipes.recipe refuses the rest with the reason; the tiers leave them out.
    workload_needs: tuple[str, str] | None = None
    # Techniques it does not combine with, each with the reason: (technique name, why not), or (a group, why not) for
    # every technique of that group (``STRATEGY``: every multi-rank strategy, a strategy added later included).
    conflicts: tuple[tuple[str, str], ...] = ()
    # Whether it joins the default selection's pairwise cover. The techniques added after the article's
    # do not: each would re-plan the greedy cover, renaming its combinations and orphaning their
    # baselines, and add fp32 ViT-L/16 cases past the nightly's 30 GPU-minutes (suite/unit/report/test_budget.py:
    # the two singles already take it from 26.7 to 29.4). Their pairs run in the full matrix.
    in_cover: bool = True
    # Whether its single case joins the default selection (the nightly). paged-adamw8bit does not: its
    # arithmetic is adamw8bit's, which the default runs, its memory effect is asserted by the sim tier
    # (claim paged-optimizer-unified-memory), and one more CUDA case would pass the nightly's 30
    # GPU-minutes (30.2 with it). Its cases run in the full matrix.
    in_default: bool = True
    # The training stacks' own names for it that a user may type for ``-t`` (TrainingArguments' flags, Lightning's
    # precision values): technique_registry.ALIASES gathers them; a name two entries give is refused as ambiguous.
    aliases: tuple[str, ...] = ()
    # The values it takes beyond its name (lora's rank, ...): a frozen class with ``parse(text)`` (a recipe id's
    # ``name[k=v,...]``), ``suffix()`` (its inverse) and ``beyond(workload)`` (what differs from the workload's
    # defaults); ``memclaims.recipes.recipe.Recipe.parameters`` holds a recipe's. None: it takes none.
    parameters: type[TechniqueParameters] | None = None
    # What it does to a run (``Hooks``; a multi-device technique's: a ``Strategy``); not part of the entry's identity.
    hooks: Hooks = field(default=NO_HOOKS, compare=False, repr=False)

    def conflict_with(self, other: Technique) -> str | None:
        """Why this technique does not combine with ``other`` (a conflict naming it or its group); None: no conflict."""
        return next((reason for name, reason in self.conflicts if name in (other.name, other.group)), None)

    @property
    def distributed(self) -> Strategy | None:
        """The technique's ``Strategy`` where it runs a recipe on several ranks; None: it runs in one process."""
        return self.hooks if isinstance(self.hooks, Strategy) else None
