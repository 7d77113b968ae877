"""The one pipeline of a real run: seed, data, load, optimizer, the training loop, accuracy, Record.

An engine says what differs between the ways a recipe runs (Lightning Fabric on one device or as
a CUDA FSDP rank in ``memclaims.measure.runner``, FSDP2 on CPU ranks in ``memclaims.measure.distributed``): how
the model is built and set up, how a loss is computed and back-propagated, how accuracy is read.
Everything around it happens here, once, in the same order for every engine, because the order
decides what the probes see. ``memclaims.run.run_recipe`` chooses the engine.
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Callable, Iterator, Sized
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from memclaims.core.record import GRADIENTS, OPTIMIZER_STATE, PARAMETERS, Record, environment_facts
from memclaims.measure import optimizers, tensors
from memclaims.measure import probes as probe_module
from memclaims.measure.host import HostSteps
from memclaims.measure.loop import TrainingLoop
from memclaims.measure.record_builder import TOP_PHASES, build_record
from memclaims.recipes.run_options import RunOptions, accuracy_schedule, evaluates
from memclaims.techniques.base import merge_observed

if TYPE_CHECKING:
    from memclaims.measure.optimizers import Built
    from memclaims.recipes.recipe import Recipe

class Engine(TrainingLoop):
    """One way to run a recipe: the loop's hooks plus the few steps of a run that differ."""

    # The Record declares the accuracy schedule (the sharded CPU ranks never did; kept as stored).
    declares_schedule = True

    def __init__(self, recipe: Recipe, options: RunOptions) -> None:
        super().__init__(recipe.accumulation_steps, recipe.loop_order)
        self.recipe, self.options = recipe, options
        self.notes: list[str] = []
        # Decided once for the run: whether it trains and scores an accuracy phase, and what that phase trains and
        # tests (the optimizer's schedule, the test set and the Record's accuracy_schedule read them).
        self.evaluating = evaluates(recipe, options)
        self.accuracy_schedule = accuracy_schedule(recipe, options)

    @property
    def precision_ran(self) -> str:
        raise NotImplementedError

    def device_name(self) -> str:
        raise NotImplementedError

    def setup_loaders(self, train: DataLoader[object], test: DataLoader[object]) -> tuple[DataLoader[object], DataLoader[object]]:
        return train, test

    def reference_load(self, probe: probe_module.Probe) -> int | None:
        """07_01's load peak for an init-module recipe, where the engine can measure it."""
        return None

    def build(self) -> tuple[nn.Module, str]:
        """The model as the load phase builds it, and whether its weights are pretrained."""
        raise NotImplementedError

    def make_optimizer(self, model: nn.Module, steps_per_epoch: int, memory_steps: int) -> Built:
        """The optimizer and scheduler, in the load phase, before ``setup`` (a stack that builds its own: the HF
        Trainer's ``optim``)."""
        return _make_optimizer(self, model, steps_per_epoch, memory_steps)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer

    def batches(self, loader: DataLoader[object]) -> Iterator[object]:
        return iter(loader)

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's own part of a (sharded) tensor: a DTensor's local shard (tensor parallelism's and FSDP2's
        parameters, their gradients and optimizer state), else the tensor."""
        to_local = getattr(tensor, "to_local", None)
        return to_local() if callable(to_local) else tensor

    def gradients(self, model: nn.Module) -> Iterator[torch.Tensor]:
        return (self.local(p.grad) for p in model.parameters() if p.grad is not None)

    def accuracy(self, model: nn.Module, loader: DataLoader[object], on_batch: Callable[[], None] | None = None) -> float:
        raise NotImplementedError

    def evaluation(self, model: nn.Module, loader: DataLoader[object]) -> dict[str, float]:
        """Eval loss, accuracy and F1 (memclaims.measure.evaluation), for RunOptions.evaluate_each_epoch."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate after each epoch")


def seed_everything(seed: int) -> None:
    """What Lightning's ``seed_everything`` does to the generators, without importing Lightning
    (which costs each spawned rank many seconds)."""
    import numpy

    os.environ["PL_GLOBAL_SEED"] = str(seed)
    os.environ["PL_SEED_WORKERS"] = "0"
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator, CUDA's included


def cycle(batches: Callable[[], Iterator[object]]) -> Iterator[object]:
    """The loader's batches over and over (a budget may be longer than an epoch of a small set)."""
    while True:
        yielded = False
        for batch in batches():
            yielded = True
            yield batch
        if not yielded:
            return


def never_reset_reserved(phases: dict[str, probe_module.PhasePeak]) -> int | None:
    """The article's figure: ``max_memory_reserved`` never reset, loading included.

    Reserved memory only grows between ``empty_cache`` calls, so the largest peak of the
    recipe's own phases is the run's peak (the reference load ran before a cache flush).
    """
    peaks = [p.reserved_bytes for name, p in phases.items() if name in TOP_PHASES and p.reserved_bytes is not None]
    return max(peaks) if peaks else None


def observed_fields(engine: Engine, model: nn.Module, optimizer: torch.optim.Optimizer, probe: probe_module.Probe) -> dict[str, Any]:
    """The Record's observed-technique fields, read right after the measured steps: the loop's, the model
    state's, and what each of the recipe's techniques observes of itself (``Hooks.observe``)."""
    recipe, local = engine.recipe, engine.local
    observed = dict(
        **engine.measured_fields(),
        optimizer_state_by_dtype=tensors.bytes_by(
            (local(t) for t in tensors.optimizer_state_tensors(optimizer)), tensors.dtype_name),
        param_bytes_by_device=tensors.bytes_by((local(p) for p in model.parameters()),
                                                    tensors.device_type),
        host_state_bytes=host_state_bytes(engine, model, optimizer),
        min_8bit_size=(recipe.scale.min_8bit_size or _bnb_default_min_8bit_size())
        if recipe.optimizer in optimizers.EIGHT_BIT else None,
    )
    for hooks in recipe.hooks:
        merge_observed(observed, hooks.observe(engine, model, optimizer, probe))
    return observed


def host_state_bytes(engine: Engine, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Model state on the host while training on a device (CPU offload), by category; empty on the
    cpu device (the host is the device there) and where nothing sits on the host."""
    if engine.options.device == "cpu":
        return {}
    local = engine.local
    params = [local(p) for p in model.parameters()]
    by_category = {PARAMETERS: params, GRADIENTS: [p.grad for p in params if p.grad is not None],
                   OPTIMIZER_STATE: [local(t) for t in tensors.optimizer_state_tensors(optimizer)]}
    on_host = {category: tensors.bytes_by(iter(held), tensors.device_type).get("cpu", 0)
               for category, held in by_category.items()}
    return {category: size for category, size in on_host.items() if size}


def _bnb_default_min_8bit_size() -> int:
    import inspect

    from bitsandbytes.optim.adam import Adam8bit

    return int(inspect.signature(Adam8bit.__init__).parameters["min_8bit_size"].default)


def scheduled_steps(engine: Engine, steps_per_epoch: int, memory_steps: int) -> int:
    """Every optimizer step the run will take: the measured steps' epoch, or the accuracy phase's epochs or its
    steps after the measured ones."""
    schedule = engine.accuracy_schedule
    if not engine.evaluating:
        return steps_per_epoch
    if schedule["kind"] == "steps":
        return int(schedule["optimizer_steps"]) + memory_steps
    return int(schedule["epochs"]) * steps_per_epoch


def _make_optimizer(engine: Engine, model: nn.Module, steps_per_epoch: int, memory_steps: int) -> Built:
    """The optimizer and scheduler, the schedule long enough for every step the run will take."""
    recipe = engine.recipe
    return optimizers.build(recipe.optimizer, model, recipe.learning_rate,
                            scheduled_steps(engine, steps_per_epoch, memory_steps),
                            min_8bit_size=recipe.scale.min_8bit_size, anneal=recipe.scale.anneal,
                            implementation=recipe.optimizer_impl, owner=recipe.optimizer_owner)


def measure(engine: Engine, probe: probe_module.Probe, memory_steps: int) -> Record:
    """Run the engine's recipe once and return what was measured."""
    recipe, options = engine.recipe, engine.options
    host = probe_module.HostMemory()
    host.start()
    seed_everything(options.seed)
    bundle = recipe.workload.load_data(recipe.scale, options.data_dir)
    collate = getattr(bundle, "collate_fn", None)  # text bundles pad each batch to its longest row
    train_loader = DataLoader(bundle.train, batch_size=recipe.micro_batch_size, shuffle=True, drop_last=True,
                              generator=torch.Generator().manual_seed(options.seed), collate_fn=collate)
    schedule = engine.accuracy_schedule
    test_set: Dataset[object] = bundle.test
    if schedule["test_examples"] is not None and len(cast(Sized, test_set)) > schedule["test_examples"]:
        test_set = Subset(test_set, range(schedule["test_examples"]))
    train_loader, test_loader = engine.setup_loaders(
        train_loader, DataLoader(test_set, batch_size=recipe.micro_batch_size, collate_fn=collate))
    steps_per_epoch = len(train_loader) // recipe.accumulation_steps

    probe.prepare()
    optimizers.prepare(recipe.optimizer, options.device)
    reference_load = engine.reference_load(probe)
    if reference_load is not None:
        probe.prepare()  # the reference's cached blocks must not pad the recipe's own numbers
        seed_everything(options.seed)  # the recipe's model starts as without it
    with probe.phase("load"):
        model, weights = engine.build()
        for hooks in recipe.converters:  # checkpointing, the fused loss's head bypass, the adapters
            model = hooks.convert_module(model, engine)
        # Counted before setup: FSDP's parameters are this rank's flat shards afterwards.
        param_count = sum(p.numel() for p in model.parameters())
        param_tensor_count = len(list(model.parameters()))
        optimizer, scheduler = engine.make_optimizer(model, steps_per_epoch, memory_steps)
        for hooks in recipe.hooks:  # optimizer-in-backward on the optimizer itself; ddp's state sync on CPU ranks
            hooks.before_setup(engine, model, optimizer)
        model, optimizer = engine.setup(model, optimizer)

    probe.track(model, optimizer)
    host_steps = HostSteps()
    # Frozen until the run's numbers are read, not only around the measured steps: the accuracy phase's
    # collections (the evaluation's probe.track) then scan the run's own objects, not the whole heap again.
    with host_steps.frozen():
        with probe.phase("train"):
            engine.train(model, optimizer, scheduler, engine.batches(train_loader), memory_steps,
                         on_step=probe.step_begin, phase=host_steps.wrap(probe.step_phase))
        if isinstance(probe, probe_module.CudaProbe):  # the snapshot of this recipe, at its peak
            probe.capture_snapshot(recipe.id)
        local = engine.local
        states: dict[str, object] = {
            "param_bytes": tensors.storage_bytes(local(p) for p in model.parameters()),
            "grad_bytes": engine.grad_bytes or 0,
            "optimizer_state_bytes": tensors.storage_bytes(
                local(t) for t in tensors.optimizer_state_tensors(optimizer)),
        }
        observed = observed_fields(engine, model, optimizer, probe)
        memory_losses = list(engine.losses)
        memory_step_times = list(engine.step_times)

        accuracy: float | None = None
        epoch_evaluations: list[dict[str, float]] = []
        if engine.evaluating:
            engine.step_times.clear()
            with probe.phase("accuracy") if options.device == "cuda" else nullcontext():
                if schedule["kind"] == "steps":
                    engine.train(model, optimizer, scheduler, cycle(lambda: engine.batches(train_loader)),
                                 schedule["optimizer_steps"])
                else:
                    for epoch in range(schedule["epochs"]):
                        engine.train(model, optimizer, scheduler, engine.batches(train_loader), -1)
                        if options.evaluate_each_epoch:
                            # Iterating a DataLoader draws its base seed from the global generator: fork it,
                            # or the later epochs' dropout and the accuracy differ from a run without it.
                            with torch.random.fork_rng(devices=[]):
                                epoch_evaluations.append({"epoch": epoch + 1, **engine.evaluation(model, test_loader)})
                probe.track(model, optimizer)  # the model states count as live from the start
                with probe.phase("evaluation"):
                    accuracy = engine.accuracy(model, test_loader, on_batch=probe.step_begin)
            timed = engine.step_times
        else:
            timed = memory_step_times[1:] or memory_step_times  # the first step warms up

    return build_record(
        recipe,
        device=options.device,
        device_name=engine.device_name(),
        probe=probe.name,
        precision=engine.precision_ran,
        memory_steps=memory_steps,
        param_count=param_count,
        param_tensor_count=param_tensor_count,
        phases=probe.phases,
        step_peaks=probe.step_peaks,
        peak_reserved_total_bytes=never_reset_reserved(probe.phases),
        reference_load_peak_bytes=reference_load,
        accuracy=accuracy,
        epoch_evaluations=epoch_evaluations,
        losses=engine.loss_fields(memory_losses),
        step_time_s=statistics.median(timed) if timed else None,
        weights=weights,
        data=bundle.name,
        host_peak_bytes=host.peak_bytes(),
        host_steps=host_steps.steps,
        environment=environment_facts(options.device),
        notes=engine.notes,
        accuracy_schedule=({**schedule, "test_examples": len(cast(Sized, test_set))}
                           if engine.evaluating and engine.declares_schedule else {}),
        observed={**states, **observed},
    )
