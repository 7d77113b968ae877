"""transformers' ``Trainer`` as the pipeline's engine: the course's Trainer code path, measured per phase.

The Trainer is built in the load phase, once the model is (``make_optimizer``): ``TrainingArguments`` from the
recipe's switches (``memclaims.techniques.hf_trainer.trainer_arguments``), the optimizer it builds itself
(``create_optimizer``: its own default where the recipe names no optimizer, else the recipe's ``optim``) or the one passed as ``optimizers=(optimizer,
None)`` (bitsandbytes' 8-bit ones, as the course passes its Adam8bit), the course's ``compute_metrics``. Each of the
pipeline's ``train`` calls is one ``trainer.train()`` of that many optimizer steps (the Trainer keeps its model,
optimizer and scheduler between calls); ``accuracy`` and ``evaluation`` are ``trainer.evaluate()``.

Where the phases open (transformers 5.x, ``Trainer._run_epoch``): ``forward`` around ``compute_loss`` (wrapped),
``backward`` around ``accelerator.backward`` (wrapped), ``clip_grad_norm`` around ``accelerator.clip_grad_norm_``
(wrapped; the Trainer computes the norm even where it does not clip), ``optimizer_step`` from the callback
``on_pre_optimizer_step`` to ``on_optimizer_step``, ``zero_grad`` from there to ``on_step_end`` (the scheduler's step
and ``model.zero_grad()``). A step's micro-batches are fetched before its first forward (``get_batch_samples``).

Isolation: accelerate's process-wide state (``AcceleratorState``, ``GradientState``) is reset before the Trainer makes
its Accelerator, and bitsandbytes' ``GlobalOptimManager`` (per-parameter overrides keyed by position, which the
Trainer's own bitsandbytes optimizers register and which outlive them: findings Q1) is restored after each run.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from memclaims.core.errors import UsageError
from memclaims.measure.loop import PhaseCallback, no_phase
from memclaims.measure.stacks.stack_driver import (
    StackDriver,
    course_optimizer_size,
    fresh_accelerate_state,
    loggers_quiet,
    transformers_model,
)
from memclaims.techniques import hf_trainer
from memclaims.techniques.base import CLIP_GRAD_NORM

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler
    from transformers import Trainer, TrainerCallback

    from memclaims.measure.optimizers import Built
    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions
    from memclaims.workloads.data import Batch


@contextmanager
def bitsandbytes_overrides_restored() -> Iterator[None]:
    """bitsandbytes' GlobalOptimManager as it was before: the Trainer's own 8-bit optimizers register an nn.Embedding
    override keyed by (group, parameter) position, which would make a later optimizer's parameter (0, 0) 32-bit."""
    try:
        from bitsandbytes.optim import GlobalOptimManager
    except ImportError:
        yield
        return
    manager = GlobalOptimManager.get_instance()
    saved = {k: v.copy() if isinstance(v, (dict, list)) else v for k, v in vars(manager).items()}
    try:
        yield
    finally:
        manager.__dict__.clear()
        manager.__dict__.update(saved)


# The workload's collate: a batch's rows as (inputs by name, labels).
Collate: TypeAlias = "Callable[[list[object]], Batch]"  # a string: Batch is imported for the type checker only


class TrainerBatches:
    """The workload's collate (inputs, labels) as the Trainer's data collator: one dict, the labels under ``labels``."""

    def __init__(self, collate: Collate | None) -> None:
        self.collate = collate or torch.utils.data.default_collate

    def __call__(self, rows: list[object]) -> dict[str, torch.Tensor]:
        inputs, labels = self.collate(rows)
        return {**inputs, "labels": labels}


def compute_metrics(prediction: Any) -> dict[str, float]:
    """The course's ``compute_metrics``: accuracy and F1 of the argmax over the logits (scikit-learn's binary F1 for
    two labels, macro otherwise)."""
    from sklearn.metrics import f1_score

    logits, labels = prediction.predictions, prediction.label_ids
    predicted = np.argmax(logits, axis=-1)
    average = "binary" if int(np.max(labels)) <= 1 and logits.shape[-1] == 2 else "macro"
    return {"accuracy": float(np.mean(predicted == labels)), "f1": float(f1_score(labels, predicted, average=average))}


class HfTrainerDriver(StackDriver):
    def __init__(self, recipe: Recipe, options: RunOptions) -> None:
        super().__init__(recipe, options)
        self.trainer: Trainer | None = None
        self._directory = tempfile.TemporaryDirectory(prefix="memclaims-hf-trainer-")  # the Trainer writes nothing
        self._train: object = None
        self._test: object = None
        self._collate: Collate | None = None
        self._eval_batch: Callable[[], None] | None = None

    @property
    def precision_ran(self) -> str:
        if self.trainer is None:
            return self.recipe.precision
        args = self.trainer.args
        return "bf16-mixed" if args.bf16 else "16-mixed" if args.fp16 else "32-true"

    def setup_loaders(self, train: DataLoader[object], test: DataLoader[object]) -> tuple[DataLoader[object], DataLoader[object]]:
        # The Trainer makes its own loaders from the data sets (per_device_*_batch_size, dataloader_drop_last).
        self._train, self._test, self._collate = train.dataset, test.dataset, train.collate_fn
        return train, test

    def build(self) -> tuple[nn.Module, str]:
        model, weights = super().build()
        if not transformers_model(model):
            raise UsageError(hf_trainer.workload_refusal(self.recipe) or
                             f"{self.recipe.id}: the Trainer computes the loss of a transformers model; "
                             f"{type(model).__name__} is none")
        return model, weights

    # --- the Trainer, in the load phase -----------------------------------------------------------------

    def make_optimizer(self, model: nn.Module, steps_per_epoch: int, memory_steps: int) -> Built:
        chosen = hf_trainer.trainer_optimizer(self.recipe)
        given = None
        if chosen.given is not None:  # the course's way: built by hand, passed in
            given, _ = super().make_optimizer(model, steps_per_epoch, memory_steps)
        self.trainer = self._make_trainer(model, given)
        if given is None:
            self.trainer.create_optimizer()
        self.observed.update(self._arguments_seen(model, given is not None))
        assert self.trainer.optimizer is not None  # the given one, or create_optimizer's
        return self.trainer.optimizer, None

    def _make_trainer(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Trainer:
        from transformers import Trainer, TrainingArguments

        arguments = hf_trainer.trainer_arguments(self.recipe)
        checkpointing = arguments.pop("checkpointing")
        names = {f.name for f in dataclasses.fields(TrainingArguments)}
        # transformers 5.2x renamed gradient_checkpointing (a deprecated alias until v6).
        arguments["activation_checkpointing" if "activation_checkpointing" in names else
                  "gradient_checkpointing"] = checkpointing
        fresh_accelerate_state()
        args = TrainingArguments(
            output_dir=self._directory.name, use_cpu=self.options.device == "cpu", seed=self.options.seed,
            report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
            dataloader_drop_last=True, log_level="error", max_steps=1, **arguments)
        trainer = Trainer(model=model, args=args, train_dataset=self._train, eval_dataset=self._test,
                          data_collator=TrainerBatches(self._collate), optimizers=(optimizer, None),
                          compute_metrics=compute_metrics, callbacks=[_phase_callback(self)])
        # disable_tqdm swaps the progress bar for PrinterCallback, which prints the logs (the run's metrics) to stdout.
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
        self._instrument(trainer)
        return trainer

    def _arguments_seen(self, model: nn.Module, given: bool) -> dict[str, object]:
        assert self.trainer is not None  # made in the load phase (make_optimizer), before any use
        args = self.trainer.args
        return {"optim": None if given else str(getattr(args.optim, "value", args.optim)),  # the default's, if none asked
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "bf16": bool(args.bf16), "fp16": bool(args.fp16), "max_grad_norm": args.max_grad_norm}

    def _instrument(self, trainer: Any) -> None:
        """The Trainer's calls that no callback brackets, wrapped on the instance (the class stays transformers').

        ``trainer`` is a ``Trainer``, left untyped: its methods are replaced on the instance, which its types forbid."""
        engine = self
        compute_loss, backward = trainer.compute_loss, trainer.accelerator.backward
        clip = trainer.accelerator.clip_grad_norm_

        def measured_loss(model: nn.Module, inputs: dict[str, torch.Tensor], *args: object, **kwargs: object) -> object:
            if not model.training:  # the evaluation loop's prediction step
                return compute_loss(model, inputs, *args, **kwargs)
            engine.micro_batch(inputs, inputs["labels"])
            with engine.phase_around("forward", model):
                return compute_loss(model, inputs, *args, **kwargs)

        def measured_backward(loss: torch.Tensor, **kwargs: object) -> None:
            engine.loss_seen(float(loss.detach().float()))  # divided by the accumulation steps already
            with engine.phase_around("backward", trainer.model):
                backward(loss, **kwargs)

        def measured_clip(parameters: object, max_norm: float, *args: object, **kwargs: object) -> object:
            engine.before_step(trainer.model)
            with engine.phase_around(CLIP_GRAD_NORM):
                return clip(parameters, max_norm, *args, **kwargs)

        trainer.compute_loss = measured_loss
        trainer.accelerator.backward = measured_backward
        trainer.accelerator.clip_grad_norm_ = measured_clip

    # --- train ------------------------------------------------------------------------------------------

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None, batches: Iterator[object], optimizer_steps: int,
              on_step: Callable[[], None] | None = None, phase: PhaseCallback = no_phase) -> None:
        """``optimizer_steps`` steps of ``trainer.train()`` (an epoch when negative); ``batches`` is the pipeline's,
        unused: the Trainer draws from its own loader."""
        assert self.trainer is not None
        args = self.trainer.args
        args.max_steps, args.num_train_epochs = (optimizer_steps, 1) if optimizer_steps > 0 else (-1, 1)
        with self.measuring(optimizer_steps, on_step, phase), quiet(), bitsandbytes_overrides_restored():
            self.trainer.train()
        self.observed.update(self._optimizer_seen(model))

    def _optimizer_seen(self, model: nn.Module) -> dict[str, object]:
        assert self.trainer is not None and self.trainer.optimizer is not None
        optimizer = self.trainer.optimizer
        inner = getattr(optimizer, "optimizer", optimizer)
        defaults = getattr(inner, "defaults", {})
        return {**course_optimizer_size(optimizer), "optimizer_class": type(inner).__name__, "fused": defaults.get("fused"),
                "foreach": defaults.get("foreach"),
                "checkpointing": hf_trainer.checkpointing(model)}

    # --- evaluate: the Trainer's evaluate() and the course's compute_metrics ---------------------------------

    def accuracy(self, model: nn.Module, loader: DataLoader[object], on_batch: Callable[[], None] | None = None) -> float:
        return self.evaluation(model, loader, on_batch)["eval_accuracy"]

    def evaluation(self, model: nn.Module, loader: DataLoader[object], on_batch: Callable[[], None] | None = None) -> dict[str, float]:
        assert self.trainer is not None
        self._eval_batch = on_batch
        try:
            with quiet():
                metrics = self.trainer.evaluate(eval_dataset=loader.dataset)
        finally:
            self._eval_batch = None
        return {key: float(metrics[key]) for key in ("eval_loss", "eval_accuracy", "eval_f1")}


def quiet() -> AbstractContextManager[None]:
    """transformers' and accelerate's info and warnings off for the run (the Trainer's banners, deprecation notes)."""
    return loggers_quiet("transformers", "accelerate")


def _phase_callback(engine: HfTrainerDriver) -> TrainerCallback:
    """The Trainer's callbacks that bracket the optimizer step and the zeroing after it."""
    from transformers import TrainerCallback

    class PhaseCallback(TrainerCallback):
        def on_pre_optimizer_step(self, args: object, state: object, control: object, **kwargs: object) -> None:
            engine.phase_begin("optimizer_step")

        def on_optimizer_step(self, args: object, state: object, control: object, **kwargs: object) -> None:
            engine.phase_end("optimizer_step")
            engine.phase_begin("zero_grad")  # the scheduler's step, then model.zero_grad()

        def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
            engine.phase_end("zero_grad")
            engine.step_done()

        def on_prediction_step(self, args: object, state: object, control: object, **kwargs: object) -> None:
            if engine._eval_batch is not None:
                engine._eval_batch()

    return PhaseCallback()
