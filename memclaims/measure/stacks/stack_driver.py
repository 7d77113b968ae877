"""What the stacks' engines share: the pipeline's engine where the stack runs the loop (``StackDriver``), and the phase
driver that opens the probes' step phases from the stack's callbacks (``PhaseDriver``).

A stack calls back at points (``on_pre_optimizer_step``, a LightningModule's ``backward``), not around blocks, so a
phase is opened at one point and closed at another; the driver keeps the one open phase and closes it before the next
opens, so phases never nest and each is recorded in the order the stack ran it. What the loop of
``memclaims.measure.loop`` observes (the compute dtypes of the first forward, the linear layers recomputed in the first
backward, the gradients at the first step, the examples of each step, the losses) the engine observes at the same
points, through ``phase``; what only a stack shows (its optimizer, its order) goes in ``observed``, the Record's
``by_technique`` entry of the stack.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from memclaims.core.record import device_name
from memclaims.measure import evaluation, pipeline
from memclaims.measure.loop import PhaseCallback, batch_examples, count_linear_calls, no_phase, watch_linear_outputs

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions


class PhaseDriver:
    """One step phase open at a time, opened and closed at a stack's callbacks; ``sequence`` names them in order."""

    def __init__(self, phase: PhaseCallback) -> None:
        self.phase = phase
        self.sequence: list[str] = []
        self._open: tuple[str, ExitStack] | None = None

    @property
    def current(self) -> str | None:
        return self._open[0] if self._open else None

    def open(self, name: str) -> None:
        self.close()
        stack = ExitStack()
        stack.enter_context(self.phase(name))
        self._open = (name, stack)
        self.sequence.append(name)

    def close(self) -> None:
        if self._open is not None:
            _, stack = self._open
            self._open = None
            stack.close()


def fresh_accelerate_state() -> None:
    """accelerate's state is a process-wide singleton (``AcceleratorState``, ``GradientState``): the Accelerator of an
    earlier run in this process (another stack's, another precision) would otherwise decide this one's mixed precision
    and accumulation. Reset before an engine makes its Accelerator (the Trainer makes one too)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def course_optimizer_size(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The course's ``compute_optimizer_size(trainer.optimizer.state.values())``: the elements and bytes of every
    tensor in the optimizer's state, each counted where it appears (bitsandbytes' quantization maps once per
    parameter), as the slides count 131,566,188 elements and 128 MB."""
    from memclaims.core.optim_state import count_every_tensor

    elements = sum(v.numel() for state in optimizer.state.values() for v in state.values()
                   if isinstance(v, torch.Tensor))
    return {"course_optimizer_size_elements": elements, "course_optimizer_size_bytes": count_every_tensor(optimizer)}


def transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers model, whose forward takes ``labels`` and returns the loss."""
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


class StackDriver(pipeline.Engine):
    """The pipeline's engine where a stack runs the loop: it builds the model and moves batches as plain PyTorch does,
    and ``train`` lets the stack train while the stack's callbacks call ``phase_begin`` / ``phase_end``,
    ``micro_batch``, ``before_step`` and ``step_done``."""

    def __init__(self, recipe: Recipe, options: RunOptions) -> None:
        super().__init__(recipe, options)
        self.device = torch.device(options.device)
        self.observed: dict[str, object] = {}  # the stack's by_technique entry (its technique's observe returns it)
        self.driver = PhaseDriver(no_phase)
        self.on_step: Callable[[], None] | None = None
        self.optimizer_steps = 0  # over the engine's life: the measured steps, then the accuracy phase's
        self._target_steps = -1
        self._examples = self._micro_batches = 0
        self._dtypes: Callable[[], list[str]] | None = None
        self._count: Callable[[], int] | None = None
        self._step_start = 0
        self._started = time.perf_counter()

    @property
    def precision_ran(self) -> str:
        return self.recipe.precision

    def device_name(self) -> str:
        return device_name(self.options.device)

    # --- load -------------------------------------------------------------------------------------

    def build(self) -> tuple[nn.Module, str]:
        model, weights = self.recipe.workload.build_model(self.recipe.scale)
        return model.to(self.device), weights

    # --- the loss, as every engine computes it ------------------------------------------------------

    def forward_loss(self, model: nn.Module, inputs: object, targets: torch.Tensor) -> torch.Tensor:
        """The workload's logits and cross-entropy, as the Fabric engine computes them."""
        return F.cross_entropy(self.recipe.workload.logits(model, inputs), targets)

    def batches(self, loader: DataLoader[object]) -> Iterator[tuple[object, torch.Tensor]]:
        for inputs, targets in loader:
            moved = {k: v.to(self.device) for k, v in inputs.items()} if isinstance(inputs, dict) else \
                inputs.to(self.device)
            yield moved, targets.to(self.device)

    # --- what the stack's callbacks call ------------------------------------------------------------

    @contextmanager
    def measuring(self, optimizer_steps: int, on_step: Callable[[], None] | None, phase: PhaseCallback) -> Iterator[None]:
        """Around one of the stack's training runs: its phases go to ``phase``; the last one open is closed."""
        self.driver = PhaseDriver(phase)
        self.on_step, self._target_steps = on_step, optimizer_steps
        self._started = time.perf_counter()
        try:
            yield
        finally:
            self.driver.close()
            self.on_step = None

    def micro_batch(self, inputs: object, targets: torch.Tensor) -> None:
        """A micro-batch begins (before its forward): the probe's step boundary, its examples counted."""
        if self.on_step is not None:
            self.on_step()
        self._examples += batch_examples(inputs, targets)
        self._micro_batches += 1

    def phase_begin(self, name: str, model: nn.Module | None = None) -> None:
        """The stack enters phase ``name``; the first forward and backward are watched as the loop watches them."""
        if name == "forward" and model is not None:
            if not self.compute_dtypes and self._dtypes is None:
                self._dtypes = watch_linear_outputs(model)
            if self.optimizer_steps == 1 and "gradients_in_forward" not in self.observed:
                # The first forward after the first step: are that step's gradients still alive?
                self.observed["gradients_in_forward"] = any(p.grad is not None for p in model.parameters())
        if name == "backward" and model is not None and self.recomputed_linear_calls is None and self._count is None:
            self._count = count_linear_calls(model)
        self.driver.open(name)

    def phase_end(self, name: str) -> None:
        if self.driver.current == name:
            self.driver.close()
        if name == "forward" and self._dtypes is not None:
            self.compute_dtypes, self._dtypes = self._dtypes(), None
        if name == "backward" and self._count is not None:
            self.recomputed_linear_calls, self._count = self._count(), None

    @contextmanager
    def phase_around(self, name: str, model: nn.Module | None = None) -> Iterator[None]:
        self.phase_begin(name, model)
        try:
            yield
        finally:
            self.phase_end(name)

    def loss_seen(self, value: float) -> None:
        """A micro-batch's loss as the loop records it (divided by the accumulation steps)."""
        self._watch(value)

    def before_step(self, model: nn.Module) -> None:
        """The gradients of a step are complete (before clipping and the optimizer step)."""
        if self.grad_bytes is None:
            self.grad_bytes = self.storage_bytes(self.gradients(model))
        self.step_examples, self.step_micro_batches = self._examples, self._micro_batches
        self._examples = self._micro_batches = 0

    def step_done(self) -> None:
        """A step ended where the stack ends it: its time, and the order of its phases (the last whole step's)."""
        self.optimizer_steps += 1
        now = time.perf_counter()
        self.step_times.append(now - self._started)
        self._started = now
        sequence = self.driver.sequence
        if self.optimizer_steps > 1:
            self.observed["step_phases"] = sequence[self._step_start:]
        self._step_start = len(sequence)

    # --- evaluate ------------------------------------------------------------------------------------

    @torch.no_grad()
    def accuracy(self, model: nn.Module, loader: DataLoader[object], on_batch: Callable[[], None] | None = None) -> float:
        import torchmetrics

        metric = torchmetrics.Accuracy(task="multiclass", num_classes=self.recipe.workload.num_classes).to(self.device)
        model.eval()
        for inputs, targets in self.batches(loader):
            if on_batch is not None:
                on_batch()
            metric.update(torch.argmax(self.recipe.workload.logits(model, inputs), 1), targets)
        return float(metric.compute())

    def evaluation(self, model: nn.Module, loader: DataLoader[object]) -> dict[str, float]:
        model.eval()
        return evaluation.evaluate(lambda inputs: self.recipe.workload.logits(model, inputs), self.batches(loader),
                                   self.recipe.workload.num_classes, self.device)


@contextmanager
def loggers_quiet(*names: str) -> Iterator[None]:
    """The named loggers at ERROR and Python's warnings off for the block, put back after: a stack's banners, info
    lines and deprecation notes are not memclaims' output."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
