"""Lightning's ``Trainer`` (``lightning.pytorch``) as the pipeline's engine, measured per phase.

The workload's model is built inside ``Trainer.init_module()`` (in the half dtype for true precisions, as Lightning
recommends) and trained as a ``LightningModule`` (``MeasuredModule``) whose hooks are where the phases open, in the
order automatic optimization calls them (lightning.pytorch.loops.optimization.automatic, Lightning 2.x):
``training_step`` (forward, under the precision plugin's autocast), ``optimizer_zero_grad`` (inside the closure, after
the forward, on the first micro-batch of each window), ``backward``, then ``on_before_optimizer_step`` to the end of
``optimizer_step`` (the optimizer's update after its closure ran). ``configure_optimizers`` returns the pipeline's
optimizer (and its scheduler, stepped per step). Each of the pipeline's ``train`` calls is one ``fit`` of that many
optimizer steps, by a Trainer of its own over the same module and optimizer. Nothing is written: no logger, no checkpoints, the root directory a temporary one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from memclaims.measure.loop import PhaseCallback, no_phase
from memclaims.measure.stacks.stack_driver import StackDriver, loggers_quiet
from memclaims.techniques import lightning_trainer

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.types import OptimizerLRScheduler
    from torch.optim.lr_scheduler import LRScheduler

    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions


def quiet() -> AbstractContextManager[None]:
    """Lightning's info lines (GPU available, the precision chosen, "max_steps reached", the litlogger tip) and its
    warnings (num_workers, the LeafSpec deprecation) off: ``lightning.pytorch`` sets its own level at import, so it is
    imported first."""
    import lightning.pytorch  # noqa: F401

    return loggers_quiet("lightning.pytorch", "lightning.fabric")


class LightningTrainerDriver(StackDriver):
    def __init__(self, recipe: Recipe, options: RunOptions) -> None:
        super().__init__(recipe, options)
        self._directory = tempfile.TemporaryDirectory(prefix="memclaims-lightning-trainer-")
        self._loader: DataLoader[object] | None = None
        self._module: pl.LightningModule | None = None
        with quiet():
            self.trainer: pl.Trainer = self._make_trainer()  # builds the model (init_module); each fit gets a Trainer of its own
        self.observed.update(precision=str(self.trainer.precision),
                             accumulate_grad_batches=self.trainer.accumulate_grad_batches)

    def _make_trainer(self, optimizer_steps: int = -1) -> pl.Trainer:
        """A Trainer of the recipe's switches for ``optimizer_steps`` steps (one epoch when negative)."""
        import lightning.pytorch as pl

        return pl.Trainer(accelerator=self.options.device, devices=1, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          max_steps=optimizer_steps if optimizer_steps > 0 else -1,
                          max_epochs=-1 if optimizer_steps > 0 else 1, default_root_dir=self._directory.name,
                          **lightning_trainer.trainer_arguments(self.recipe))

    @property
    def precision_ran(self) -> str:
        return str(self.trainer.precision)

    def setup_loaders(self, train: DataLoader[object], test: DataLoader[object]) -> tuple[DataLoader[object], DataLoader[object]]:
        self._loader = train  # Lightning's fit takes the loader; it moves each batch (transfer_batch_to_device)
        return train, test

    def build(self) -> tuple[nn.Module, str]:
        with quiet(), self.trainer.init_module():
            model, weights = self.recipe.workload.build_model(self.recipe.scale)
        self.observed["built_dtypes"] = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
        return model, weights

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None, batches: Iterator[object], optimizer_steps: int,
              on_step: Callable[[], None] | None = None, phase: PhaseCallback = no_phase) -> None:
        """``optimizer_steps`` steps of ``Trainer.fit`` over the loader (an epoch when negative); ``batches`` is the
        pipeline's, unused: Lightning iterates the loader itself."""
        if self._module is None:
            self._module = _measured_module(self, model, optimizer, scheduler)
        with quiet():
            self.trainer = self._make_trainer(optimizer_steps)
            with self.measuring(optimizer_steps, on_step, phase):
                self.trainer.fit(self._module, train_dataloaders=self._loader)
        self.observed["param_dtypes"] = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})


def _measured_module(engine: LightningTrainerDriver, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None) -> pl.LightningModule:
    """The workload's model as a LightningModule whose hooks open the probes' phases."""
    import lightning.pytorch as pl

    class MeasuredModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: tuple[object, torch.Tensor], batch_index: int) -> torch.Tensor:
            inputs, targets = batch
            engine.micro_batch(inputs, targets)
            with engine.phase_around("forward", self.model):
                return engine.forward_loss(self.model, inputs, targets)

        def optimizer_zero_grad(self, epoch: int, batch_index: int, optimizer: torch.optim.Optimizer) -> None:
            with engine.phase_around("zero_grad"):
                optimizer.zero_grad()

        def backward(self, loss: torch.Tensor, *args: object, **kwargs: object) -> None:
            engine.loss_seen(float(loss.detach().float()))  # Lightning divided it by accumulate_grad_batches
            with engine.phase_around("backward", self.model):
                loss.backward(*args, **kwargs)

        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            engine.before_step(self.model)
            engine.phase_begin("optimizer_step")

        def optimizer_step(self, *args: Any, **kwargs: Any) -> None:  # forwarded as Lightning calls it
            super().optimizer_step(*args, **kwargs)
            engine.phase_end("optimizer_step")
            engine.step_done()

        def configure_optimizers(self) -> OptimizerLRScheduler:
            if scheduler is None:
                return optimizer
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return MeasuredModule()
