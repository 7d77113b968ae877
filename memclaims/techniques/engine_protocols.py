"""What a technique's hooks use of the engines that call them, named as narrow protocols (issue #51).

A technique never imports an engine, not even for its types (ARCHITECTURE.md): the hooks of ``base.Hooks`` name the
engine's loop, the real run, its probe and the sim's session by what they read of them, here. Each protocol lists
only the members some hook uses; the engines' own classes (``memclaims.measure.pipeline.Engine``,
``memclaims.measure.probes.Probe``, ``memclaims.sim.replay.Session``, the sim's training loop) match them without
naming them, and mypy checks that they do where an engine calls a hook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from lightning.fabric import Fabric

    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions
    from memclaims.techniques.base import LoopHelper


class EngineLoop(Protocol):
    """An engine's training loop (``memclaims.measure.loop.TrainingLoop``, the real run's and the sim's): the helpers a
    technique puts on it, and its optimizer step (a per-parameter step steps as the loop does)."""

    helpers: list[LoopHelper]

    def step(self, optimizer: torch.optim.Optimizer) -> None: ...


class RealRun(EngineLoop, Protocol):
    """A real run on one device or one rank (``memclaims.measure.pipeline.Engine``)."""

    recipe: Recipe
    options: RunOptions
    notes: list[str]  # the Record's notes of what the run did
    digests_gradients: bool  # whether the loop digests the gradients after the first backward (the ranks compare them)

    @property
    def precision_ran(self) -> str:
        """The precision Lightning ran (on the CPU it runs 16-mixed as bf16-mixed)."""
        ...

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's own part of a (sharded) tensor."""
        ...


class FabricRun(RealRun, Protocol):
    """A real run through Lightning Fabric (``memclaims.measure.runner``'s engine): the model is built inside Fabric's
    ``init_module``, on its device."""

    @property
    def fabric(self) -> Fabric: ...

    @property
    def device(self) -> torch.device: ...


class PhaseReading(Protocol):
    """One phase's peak as a probe read it (``memclaims.measure.probes.PhasePeak``)."""

    @property
    def allocated_bytes(self) -> int: ...


class StepGrowth(Protocol):
    """What each step phase added, per step, by counter (a probe's or the sim's recorder's ``step_growth``)."""

    @property
    def step_growth(self) -> Mapping[str, list[dict[str, int]]]: ...


class PhaseProbe(StepGrowth, Protocol):
    """A real run's probe (``memclaims.measure.probes.Probe``): its named phases and their peaks."""

    @property
    def phases(self) -> Mapping[str, PhaseReading]: ...

    def phase(self, name: str) -> AbstractContextManager[object]: ...


class SimLoop(EngineLoop, Protocol):
    """The sim's training loop (``memclaims.sim.replay``'s): the recipe it replays and its precision's compute dtype."""

    recipe: Recipe

    @property
    def precision(self) -> ComputesIn: ...


class ComputesIn(Protocol):
    """A precision as the sim's loop applies it: the dtype its forward pass computes in."""

    @property
    def compute(self) -> torch.dtype: ...


class SimDeviceMemory(Protocol):
    """What the hooks use of the sim's device accounting (``memclaims.sim.tracker.DeviceMemory``): the activation
    offload's copies outside it and host bytes (``techniques/impl/saved_tensor_offload_fake.py``), qlora's GEMM
    scratch."""

    # The scratch an op's kernel takes inside it, by op (qlora's 4-bit GEMM): bytes from the op's arguments.
    op_scratch: dict[object, Callable[[object, tuple[object, ...], dict[str, object]], int]]

    def outside(self) -> AbstractContextManager[None]: ...

    def host_bytes(self, tensors: Iterable[torch.Tensor]) -> int: ...


class SimProfile(Protocol):
    """The sim's profile (``memclaims.sim.profiles.Profile``): the GPU it models, by name."""

    @property
    def gpu(self) -> str: ...


class SimAllocator(Protocol):
    """The sim's allocator model (``memclaims.sim.allocator.CachingAllocator``): what it mapped in expandable segments."""

    @property
    def expandable_bytes(self) -> int: ...


class SimSession(Protocol):
    """One simulated device (``memclaims.sim.replay.Session``)."""

    @property
    def memory(self) -> SimDeviceMemory: ...

    @property
    def profile(self) -> SimProfile: ...

    @property
    def recorder(self) -> StepGrowth: ...

    @property
    def allocator(self) -> SimAllocator: ...
