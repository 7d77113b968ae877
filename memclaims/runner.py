"""One training run of a recipe: load, a few measured training steps, then an accuracy phase.

The loop replays the article's scripts, including where they call ``zero_grad`` (after the
forward pass, or after the step with gradient accumulation), because that decides the peak.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from memclaims import optimizers
from memclaims import probes as probe_module
from memclaims.errors import OutOfMemory, UsageError
from memclaims.loop import TrainingLoop
from memclaims.recipe import Recipe
from memclaims.record import Record, device_name, environment_facts, library_versions
from memclaims.techniques import FP32
from memclaims.workloads import SEED

DEVICES = ("cpu", "cuda")
TRUE_HALF = {"16-true": torch.float16, "bf16-true": torch.bfloat16}


@dataclass(frozen=True)
class RunOptions:
    device: str = "cpu"
    memory_steps: int | None = None  # None: the scale's default
    evaluate: bool = True
    accuracy_epochs: int | None = None  # None: the scale's default
    data_dir: str | os.PathLike[str] | None = None
    seed: int = SEED  # the article's; other seeds measure the spread that tolerances come from
    # Processes (CPU) or GPUs of a sharded recipe's run; None: memclaims.distributed's default.
    devices: int | None = None
    # Whole epochs for accuracy even where the scale has a budgeted schedule (the weekly run).
    accuracy_full_epochs: bool = False


DIVERGING_RECIPE = ("16-true",)  # claim 3: the article's 16-true run went NaN near batch 300


def accuracy_schedule(recipe: Recipe, options: RunOptions) -> dict[str, Any]:
    """What the accuracy phase trains and tests; the Record declares it (``accuracy_schedule``).

    ``epochs``: whole epochs and the whole test set (the article's way; asked for with
    accuracy_epochs or accuracy_full_epochs, or where the scale has no budget). ``steps``: the
    scale's budget, a fixed number of optimizer steps and at most so many test examples.
    """
    scale = recipe.scale
    if options.accuracy_epochs or options.accuracy_full_epochs or scale.accuracy_steps is None:
        return {"kind": "epochs", "epochs": options.accuracy_epochs or scale.accuracy_epochs,
                "optimizer_steps": None, "test_examples": None}
    steps = scale.accuracy_steps
    if recipe.techniques == DIVERGING_RECIPE and scale.divergence_steps:
        steps = max(steps, scale.divergence_steps)
    return {"kind": "steps", "epochs": None, "optimizer_steps": steps, "test_examples": scale.accuracy_test_examples}


def _cycle(batches: Any) -> Iterator[Any]:
    """The loader's batches over and over (a budget may be longer than an epoch of a small set)."""
    while True:
        yielded = False
        for batch in batches():
            yielded = True
            yield batch
        if not yielded:
            return


def resolve_memory_steps(recipe: Recipe, options: RunOptions) -> int:
    """The optimizer steps the probes measure: the option, else the scale's default."""
    steps = options.memory_steps if options.memory_steps is not None else recipe.scale.memory_steps
    if steps < 1:
        raise UsageError(f"--steps must be at least 1 (got {steps})")
    return steps


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; valid devices: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU, and torch sees none on this machine")


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, dict):
        return {k: v.to(device) for k, v in batch.items()}
    return batch.to(device)


class _Session(TrainingLoop):
    """The state of one run; a class only so that the phases can share it without globals."""

    def __init__(self, recipe: Recipe, options: RunOptions, probe: probe_module.Probe) -> None:
        super().__init__(recipe.accumulation_steps)
        self.recipe, self.options, self.probe = recipe, options, probe
        self.notes: list[str] = []
        self.fabric: Any = None
        self.device = torch.device(options.device)
        if not recipe.plain_pytorch:
            from lightning.fabric import Fabric

            if recipe.sharded:
                # One rank of a multi-GPU run whose processes memclaims.distributed started.
                from memclaims.distributed import sharded_fabric

                self.fabric = sharded_fabric(recipe, options)
            else:
                self.fabric = Fabric(accelerator=options.device, devices=1, precision=recipe.precision)
            self.device = self.fabric.device

    @property
    def precision_ran(self) -> str:
        if self.fabric is None:
            return FP32
        return str(self.fabric.strategy.precision.precision)

    # --- load ------------------------------------------------------------------------------

    def build(self) -> tuple[nn.Module, str]:
        recipe = self.recipe
        if recipe.delayed_init:  # 11: built inside init_module under FSDP, empty_init=False as logged
            with self.fabric.init_module(empty_init=False):
                return recipe.workload.build_model(recipe.scale)
        if recipe.init_on_device:
            with self.fabric.init_module():
                return recipe.workload.build_model(recipe.scale)
        model, weights = recipe.workload.build_model(recipe.scale)
        if self.fabric is None:
            return model.to(self.device), weights
        return model, weights

    def reference_load(self) -> int:
        """07_01: build on the CPU in fp32, then ``.to(device).to(dtype)``; returns its peak."""
        with self.probe.phase("load-reference"):
            model, _ = self.recipe.workload.build_model(self.recipe.scale)
            model.to(self.device).to(TRUE_HALF.get(self.recipe.precision, torch.float32))
            del model
        return self.probe.phases["load-reference"].allocated_bytes

    def make_optimizer(self, model: nn.Module, steps_per_epoch: int) -> tuple[torch.optim.Optimizer, Any]:
        epochs = self.accuracy_epochs if self.options.evaluate else 1
        schedule = accuracy_schedule(self.recipe, self.options)
        total = epochs * steps_per_epoch
        if self.options.evaluate and schedule["kind"] == "steps":
            total = schedule["optimizer_steps"] + resolve_memory_steps(self.recipe, self.options)
        return optimizers.build(self.recipe.optimizer, model, self.recipe.learning_rate, total,
                                min_8bit_size=self.recipe.scale.min_8bit_size)

    @property
    def accuracy_epochs(self) -> int:
        return self.options.accuracy_epochs or self.recipe.scale.accuracy_epochs

    # --- train -----------------------------------------------------------------------------

    def micro_batches(self, loader: DataLoader) -> Iterator[tuple[Any, torch.Tensor]]:
        for inputs, targets in loader:
            if self.fabric is None:
                inputs, targets = _to_device(inputs, self.device), targets.to(self.device)
            yield inputs, targets

    def forward_loss(self, model: nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.recipe.workload.logits(model, inputs), targets)

    def backward(self, loss: torch.Tensor) -> None:
        if self.fabric is None:
            loss.backward()
        else:
            self.fabric.backward(loss)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # --- evaluate --------------------------------------------------------------------------

    @torch.no_grad()
    def accuracy(self, model: nn.Module, loader: DataLoader, on_batch: Any = None) -> float:
        import torchmetrics

        metric = torchmetrics.Accuracy(task="multiclass", num_classes=self.recipe.workload.num_classes)
        metric = metric.to(self.device)
        model.eval()
        for inputs, targets in self.micro_batches(loader):
            if on_batch is not None:
                on_batch()
            predicted = torch.argmax(self.recipe.workload.logits(model, inputs), 1)
            metric.update(predicted, targets)
        return float(metric.compute())


PHASES = ("load", "train", "accuracy")


# "Tried to allocate 2.00 GiB" (CUDA caching allocator), "you tried to allocate 123 bytes" (CPU).
_REQUEST = re.compile(r"[Tt]ried to allocate ([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)")
_UNIT = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def out_of_memory_request(error: BaseException) -> int | None:
    """Bytes an allocator failed to provide, read from its message; None if it is no OOM message."""
    match = _REQUEST.search(str(error))
    if match:
        return int(float(match.group(1)) * _UNIT[match.group(2)])
    if "can't allocate memory" in str(error) or "out of memory" in str(error).lower():
        return 0
    return None


def _never_reset_reserved(phases: dict[str, probe_module.PhasePeak]) -> int | None:
    """The article's figure: ``max_memory_reserved`` never reset, loading included.

    Reserved memory only grows between ``empty_cache`` calls, so the largest peak of the
    recipe's own phases is the run's peak (the reference load ran before a cache flush).
    """
    peaks = [p.reserved_bytes for name, p in phases.items()
             if name in ("load", "train", "accuracy") and p.reserved_bytes is not None]
    return max(peaks) if peaks else None


def run(recipe: Recipe, options: RunOptions, probe: probe_module.Probe | None = None) -> Record:
    """Run ``recipe`` once and return what was measured."""
    check_device(options.device)
    if recipe.sharded and options.device == "cpu":
        # Lightning refuses FSDP on the CPU; memclaims.distributed shards with FSDP2 over gloo.
        raise UsageError(f"{recipe.id} is sharded: run it with memclaims.distributed.run_distributed")
    memory_steps = resolve_memory_steps(recipe, options)
    probe = probe or probe_module.make_probe(options.device)
    matmul_precision, threads = torch.get_float32_matmul_precision(), torch.get_num_threads()
    if recipe.scale.name == "smoke":
        # Smoke-scale matmuls are too small to gain from intra-op threads, and idle threads
        # spin-waiting on a shared 2-core machine made them 10x slower.
        torch.set_num_threads(1)
    host = probe_module.HostMemory()
    host.start()
    try:
        from memclaims.determinism import deterministic

        with deterministic(options.device) as determinism_notes:  # CUDA only: accuracy run to run
            record = _run(recipe, options, probe, memory_steps)
        record.notes.extend(determinism_notes)
        record.host_peak_bytes = host.peak_bytes()
        record.environment = environment_facts(options.device)
        return record
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as error:
        requested = out_of_memory_request(error)
        if requested is None and not isinstance(error, (torch.OutOfMemoryError, MemoryError)):
            raise
        phase = next((p for p in PHASES if p not in probe.phases), "accuracy")
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise OutOfMemory(recipe.id, options.device, phase, requested if requested else None, first_line) from error
    finally:
        torch.set_float32_matmul_precision(matmul_precision)
        torch.set_num_threads(threads)


def _run(recipe: Recipe, options: RunOptions, probe: probe_module.Probe, memory_steps: int) -> Record:
    from lightning.fabric.utilities.seed import seed_everything

    session = _Session(recipe, options, probe)
    if recipe.precision != FP32:
        torch.set_float32_matmul_precision("high")  # as the scripts from 02 on
    if session.precision_ran != recipe.precision:
        session.notes.append(
            f"Lightning ran {recipe.precision} as {session.precision_ran} on {options.device}"
        )
    seed_everything(options.seed, verbose=False)
    bundle = recipe.workload.load_data(recipe.scale, options.data_dir)
    generator = torch.Generator().manual_seed(options.seed)
    collate = getattr(bundle, "collate_fn", None)  # text bundles pad each batch to its longest row
    train_loader = DataLoader(bundle.train, batch_size=recipe.micro_batch_size, shuffle=True,
                              drop_last=True, generator=generator, collate_fn=collate)
    schedule = accuracy_schedule(recipe, options)
    test_set = bundle.test
    if schedule["test_examples"] is not None and len(test_set) > schedule["test_examples"]:  # type: ignore[arg-type]
        from torch.utils.data import Subset

        test_set = Subset(test_set, range(schedule["test_examples"]))
    test_loader = DataLoader(test_set, batch_size=recipe.micro_batch_size, collate_fn=collate)
    if session.fabric is not None:
        train_loader, test_loader = session.fabric.setup_dataloaders(train_loader, test_loader)
    steps_per_epoch = len(train_loader) // recipe.accumulation_steps

    probe.prepare()
    optimizers.prepare(recipe.optimizer, options.device)
    reference_load = None
    if recipe.init_on_device:
        reference_load = session.reference_load()
        probe.prepare()  # the reference's cached blocks must not pad the recipe's own numbers
        seed_everything(options.seed, verbose=False)  # the recipe's model starts as without it
    with probe.phase("load"):
        model, weights = session.build()
        # Counted before setup: FSDP's parameters are this rank's flat shards afterwards.
        param_count = sum(p.numel() for p in model.parameters())
        param_tensor_count = len(list(model.parameters()))
        optimizer, scheduler = session.make_optimizer(model, steps_per_epoch)
        if session.fabric is not None:
            # 09: with CPU offload the model stays on the host; FSDP moves what it needs.
            model, optimizer = session.fabric.setup(model, optimizer, move_to_device=not recipe.cpu_offload)

    probe.track(model, optimizer)
    with probe.phase("train"):
        session.train(model, optimizer, scheduler, session.micro_batches(train_loader), memory_steps,
                      on_step=probe.step_begin, phase=probe.step_phase)
    if isinstance(probe, probe_module.CudaProbe):  # the snapshot of this recipe, at its peak
        probe.capture_snapshot(recipe.id)
    states = probe_module.model_state_bytes(model, optimizer)
    states["grad_bytes"] = session.grad_bytes or 0
    observed = _observed(session, model, optimizer, recipe)
    memory_losses = list(session.losses)
    memory_step_times = list(session.step_times)

    accuracy: float | None = None
    if options.evaluate:
        session.step_times.clear()
        with probe.phase("accuracy") if options.device == "cuda" else nullcontext():
            if schedule["kind"] == "steps":
                session.train(model, optimizer, scheduler,
                              _cycle(lambda: session.micro_batches(train_loader)), schedule["optimizer_steps"])
            else:
                for _ in range(session.accuracy_epochs):
                    session.train(model, optimizer, scheduler, session.micro_batches(train_loader), -1)
            probe.track(model, optimizer)  # the model states count as live from the start
            with probe.phase("evaluation"):
                accuracy = session.accuracy(model, test_loader, on_batch=probe.step_begin)
        timed = session.step_times
    else:
        timed = memory_step_times[1:] or memory_step_times  # the first step warms up

    load, train = probe.phases["load"], probe.phases["train"]
    return Record(
        **recipe.record_fields(),
        device=options.device,
        device_name=device_name(options.device),
        probe=probe.name,
        precision=session.precision_ran,
        memory_steps=memory_steps,
        param_count=param_count,
        param_tensor_count=param_tensor_count,
        load_peak_bytes=load.allocated_bytes,
        peak_allocated_bytes=max(load.allocated_bytes, train.allocated_bytes),
        peak_reserved_bytes=(
            max(load.reserved_bytes, train.reserved_bytes)
            if load.reserved_bytes is not None and train.reserved_bytes is not None else None
        ),
        peak_reserved_total_bytes=_never_reset_reserved(probe.phases),
        reference_load_peak_bytes=reference_load,
        accuracy=accuracy,
        **session.loss_fields(memory_losses),
        step_time_s=statistics.median(timed) if timed else None,
        weights=weights,
        data=bundle.name,
        versions=library_versions(),
        phases=probe_module.phase_entries(probe.phases),
        step_peaks={name: list(peaks) for name, peaks in probe.step_peaks.items()},
        breakdown=dict(train.breakdown),
        notes=session.notes,
        accuracy_schedule=({**schedule, "test_examples": len(test_set)}  # type: ignore[arg-type]
                           if options.evaluate else {}),
        **states,
        **observed,
    )


def _observed(loop: TrainingLoop, model: nn.Module, optimizer: Any, recipe: Recipe,
              local: Any = None) -> dict[str, Any]:
    """The Record's observed-technique fields, read right after the measured steps; ``local``
    maps a sharded tensor to this rank's shard."""
    local = local or (lambda tensor: tensor)
    return dict(
        **loop.measured_fields(),
        optimizer_state_by_dtype=probe_module.bytes_by(
            (local(t) for t in probe_module.optimizer_state_tensors(optimizer)), probe_module.dtype_name),
        param_bytes_by_device=probe_module.bytes_by((local(p) for p in model.parameters()),
                                                    probe_module.device_type),
        min_8bit_size=(recipe.scale.min_8bit_size or _bnb_default_min_8bit_size())
        if recipe.optimizer in optimizers.EIGHT_BIT else None,
    )


def _bnb_default_min_8bit_size() -> int:
    import inspect

    import bitsandbytes as bnb

    return int(inspect.signature(bnb.optim.Adam8bit.__init__).parameters["min_8bit_size"].default)
