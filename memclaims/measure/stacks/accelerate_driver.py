"""Accelerate as the pipeline's engine: the course's loop around ``accelerate.Accelerator``, measured per phase.

The course's code, as this engine runs it::

    accelerator = Accelerator(mixed_precision=..., gradient_accumulation_steps=...)
    model, adam_bnb_optim, train_dataloader, lr_scheduler = accelerator.prepare(model, adam_bnb_optim,
                                                                                train_dataloader, lr_scheduler)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

The loader is prepared with the data (``setup_loaders``), the model and the optimizer in the load phase (``setup``),
the scheduler at the first step (the pipeline builds it with the optimizer). A transformers sequence classifier
computes its own loss from ``labels`` (``outputs.loss``, the course's); any other model the workload's logits and
cross-entropy, as every engine. ``optimizer.step()`` and ``zero_grad()`` run on every micro-batch as the course calls
them; under ``accumulate`` they reach the optimizer only on the window's last one, and only there are they a phase.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader

from memclaims.measure.loop import PhaseCallback, no_phase
from memclaims.measure.stacks.stack_driver import (
    StackDriver,
    course_optimizer_size,
    fresh_accelerate_state,
    transformers_model,
)
from memclaims.techniques import accelerate_loop

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions

# The recipe's precision for the Accelerator's mixed_precision, the other way.
PRECISION_RAN = {value: key for key, value in accelerate_loop.MIXED_PRECISION.items()}


class Steps(Protocol):
    """What the loop uses of accelerate's prepared scheduler (an ``AcceleratedScheduler``)."""

    def step(self) -> None: ...


class AccelerateDriver(StackDriver):
    def __init__(self, recipe: Recipe, options: RunOptions) -> None:
        super().__init__(recipe, options)
        from accelerate import Accelerator

        fresh_accelerate_state()
        self.accelerator = Accelerator(cpu=options.device == "cpu", **accelerate_loop.accelerator_arguments(recipe))
        self.device = self.accelerator.device
        self.outputs: object = None  # the course's ``outputs``, bound until the next forward
        self._scheduler: Steps | None = None
        self._model_loss = False
        self._raw_steps: int | None = None  # the optimizer's real steps, counted in the measured steps' train call
        self.observed.update(mixed_precision=str(self.accelerator.mixed_precision),
                             gradient_accumulation_steps=self.accelerator.gradient_accumulation_steps)

    @property
    def precision_ran(self) -> str:
        return PRECISION_RAN.get(str(self.accelerator.mixed_precision), str(self.accelerator.mixed_precision))

    def setup_loaders(self, train: DataLoader[object], test: DataLoader[object]) -> tuple[DataLoader[object], DataLoader[object]]:
        return self.accelerator.prepare(train), test

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        self._model_loss = transformers_model(model) and self.recipe.workload.logits_fn is None
        prepared_model, prepared = self.accelerator.prepare(model, optimizer)  # prepared: an AcceleratedOptimizer
        # The optimizer really stepping, wherever the loop is (under accumulate the wrapper's step reaches it once per
        # window): torch's own step hook on the optimizer inside accelerate's wrapper, not the stack's sync_gradients.
        prepared.optimizer.register_step_post_hook(lambda *args: self._raw_step())
        return prepared_model, prepared

    def _raw_step(self) -> None:
        if self._raw_steps is not None:  # the measured steps' call (the accuracy phase's are not counted)
            self._raw_steps += 1

    def batches(self, loader: DataLoader[object]) -> Iterator[tuple[object, torch.Tensor]]:
        return iter(loader)  # the prepared loader places each batch on the device itself

    def forward_loss(self, model: nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        # Bound to the engine as the course's ``outputs`` is to its loop: the previous one lives through this forward.
        if self._model_loss:  # outputs = model(**batch); loss = outputs.loss
            self.outputs = outputs = model(**inputs, labels=targets)
            loss: torch.Tensor = outputs.loss
            return loss
        self.outputs = self.recipe.workload.logits(model, inputs)
        return torch.nn.functional.cross_entropy(self.outputs, targets)

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None, batches: Iterator[object], optimizer_steps: int,
              on_step: Callable[[], None] | None = None, phase: PhaseCallback = no_phase) -> None:
        if scheduler is not None and self._scheduler is None:
            self._scheduler = self.accelerator.prepare(scheduler)
        measured = "optimizer_steps" not in self.observed  # the pipeline's first call: the measured steps
        self._raw_steps = 0 if measured else None
        micro_batches = self._train(model, optimizer, batches, optimizer_steps, on_step, phase)
        if measured:
            self.observed.update(optimizer_steps=self._raw_steps, micro_batches=micro_batches)
        self._raw_steps = None
        self.observed.update(course_optimizer_size(optimizer))  # over accelerator.prepare's optimizer, as the course

    def _train(self, model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[Any], optimizer_steps: int,
               on_step: Callable[[], None] | None, phase: PhaseCallback) -> int:
        """The loop; returns the micro-batches it trained."""
        accelerator, accumulation = self.accelerator, self.recipe.accumulation_steps
        done = micro_batches = 0
        with self.measuring(optimizer_steps, on_step, phase), warnings.catch_warnings():
            # torch's ModTracker (under the cpu probe's MemTracker) warns once when a module's weak reference is gone
            # by its backward hook; nothing is lost.
            warnings.filterwarnings("ignore", message="Module is None")
            for inputs, targets in batches:
                micro_batches += 1
                with accelerator.accumulate(model):
                    model.train()
                    self.micro_batch(inputs, targets)
                    with self.phase_around("forward", model):
                        loss = self.forward_loss(model, inputs, targets)
                    self.loss_seen(float(loss.detach().float()) / accumulation)
                    with self.phase_around("backward", model):
                        accelerator.backward(loss)  # divides by gradient_accumulation_steps
                    del loss
                    stepping = accelerator.sync_gradients
                    if stepping:
                        self.before_step(model)
                        self.phase_begin("optimizer_step")
                    optimizer.step()
                    if stepping:
                        self.phase_end("optimizer_step")
                    if self._scheduler is not None:
                        self._scheduler.step()
                    if stepping:
                        self.phase_begin("zero_grad")
                    optimizer.zero_grad()
                    if stepping:
                        self.phase_end("zero_grad")
                        self.step_done()
                        done += 1
                        if done == optimizer_steps:
                            return micro_batches
        return micro_batches
