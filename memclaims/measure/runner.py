"""One device's engine: Lightning Fabric (plain PyTorch for script 01), or one CUDA rank of a
Lightning FSDP run; and ``run``, one recipe in this process through ``memclaims.measure.pipeline``.

The article's scripts run their recipes through Fabric, so the Fabric engine is the reference:
what Fabric does (precision plugins, ``init_module``, ``setup``) is what the Record measures.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from memclaims.core.errors import OutOfMemory, UsageError
from memclaims.core.names import CONVERGED
from memclaims.core.record import Record, device_name
from memclaims.measure import evaluation, pipeline
from memclaims.measure import probes as probe_module
from memclaims.measure.record_builder import failed_phase
from memclaims.recipes.run_options import RunOptions, check_device, resolve_memory_steps
from memclaims.techniques.base import PYTORCH, LoadsReference, SetsAllocator, SetsUpOptions
from memclaims.techniques.technique_registry import FP32

if TYPE_CHECKING:
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT

    from memclaims.recipes.recipe import Recipe

SINGLE_THREADED_SCALES = ("smoke", CONVERGED)


def _to_device(batch: torch.Tensor | dict[str, torch.Tensor], device: torch.device) -> object:
    if isinstance(batch, dict):
        return {k: v.to(device) for k, v in batch.items()}
    return batch.to(device)


class FabricEngine(pipeline.Engine):
    """Fabric on ``options.device`` (none for plain PyTorch); a multi-device recipe's Fabric is one rank
    of the FSDP, DDP or DeepSpeed run whose processes ``memclaims.measure.distributed`` started."""

    def __init__(self, recipe: Recipe, options: RunOptions) -> None:
        super().__init__(recipe, options)
        self.fabric: Any = None  # a Fabric, or None for plain PyTorch (FabricRun's hooks read it as a Fabric)
        self.device = torch.device(options.device)
        if recipe.stack != PYTORCH:
            from lightning.fabric import Fabric

            if recipe.distributed:
                from memclaims.measure.lightning_fsdp import sharded_fabric

                self.fabric = sharded_fabric(recipe, options)
            else:
                self.fabric = Fabric(accelerator=options.device, devices=1, precision=cast("_PRECISION_INPUT", recipe.precision))
            self.device = self.fabric.device
        if recipe.precision != FP32:
            torch.set_float32_matmul_precision("high")  # as the scripts from 02 on
        if self.precision_ran != recipe.precision:
            self.notes.append(f"Lightning ran {recipe.precision} as {self.precision_ran} on {options.device}")
        for hooks in recipe.hooks:  # the loop's helpers: activation-offload's hooks, the fused loss
            hooks.attach(self)

    @property
    def precision_ran(self) -> str:
        if self.fabric is None:
            return FP32
        return str(self.fabric.strategy.precision.precision)

    def device_name(self) -> str:
        return device_name(self.options.device)

    def setup_loaders(self, train: DataLoader[object], test: DataLoader[object]) -> tuple[DataLoader[object], DataLoader[object]]:
        if self.fabric is None:
            return train, test
        strategy, devices = self.recipe.distributed, self.options.devices
        if strategy is not None and devices and self.recipe.strategy_plan(devices).data_parallel == 1:
            # One data-parallel replica (tensor parallelism's ranks all share each batch): every rank iterates the
            # loader as one process does. Fabric's DistributedSampler over 1 replica would only reorder the data
            # (the loader draws its workers' seed from its generator before its sampler's permutation; the
            # DistributedSampler seeds a generator of its own).
            return tuple(self.fabric.setup_dataloaders(train, test, use_distributed_sampler=False))
        return tuple(self.fabric.setup_dataloaders(train, test))

    # --- load ------------------------------------------------------------------------------

    def build(self) -> tuple[nn.Module, str]:
        recipe = self.recipe
        # init-module (07-03) builds inside fabric.init_module(), delayed-init (11) inside
        # init_module(empty_init=False) under FSDP; the technique's context, where one has it.
        contexts = [c for c in (hooks.init_context(self) for hooks in recipe.hooks) if c is not None]
        if contexts:
            with contexts[-1]:
                return recipe.workload.build_model(recipe.scale)
        model, weights = recipe.workload.build_model(recipe.scale)
        if self.fabric is None:
            return model.to(self.device), weights
        return model, weights

    def reference_load(self, probe: probe_module.Probe) -> int | None:
        """A technique's reference load (07_01 for init-module), measured before the recipe's own."""
        for hooks in self.recipe.hooks:
            peak = hooks.reference_load(self, probe) if isinstance(hooks, LoadsReference) else None
            if peak is not None:
                return peak
        return None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        if self.fabric is None:
            return model, optimizer
        options: dict[str, object] = {"move_to_device": True}  # Fabric.setup's keywords
        for hooks in self.recipe.hooks:  # 09: with CPU offload the model stays on the host; FSDP moves what it needs
            if isinstance(hooks, SetsUpOptions):
                options.update(hooks.setup_options())
        strategy = self.recipe.distributed
        if strategy is not None and strategy.replaces_parameters:
            # Lightning's order for ModelParallelStrategy (its guides): the model first, then the optimizer; the
            # optimizer made before setup, as the scripts make it, follows its parameters to the DTensor ones.
            before = list(model.parameters())
            module = self.fabric.setup_module(model, **options)
            follow_parameters(optimizer, before, list(model.parameters()))
            return module, self.fabric.setup_optimizers(optimizer)
        model, optimizer = self.fabric.setup(model, optimizer, **options)
        return model, optimizer

    # --- train -----------------------------------------------------------------------------

    def batches(self, loader: DataLoader[object]) -> Iterator[tuple[object, torch.Tensor]]:
        for inputs, targets in loader:
            if self.fabric is None:
                inputs, targets = _to_device(inputs, self.device), targets.to(self.device)
            yield inputs, targets

    def forward_loss(self, model: nn.Module, inputs: object, targets: torch.Tensor) -> torch.Tensor:
        logits = self.recipe.workload.logits(model, inputs)
        loss = self.technique_loss(model, logits, targets)  # fused-linear-ce's, from the hidden states
        return loss if loss is not None else F.cross_entropy(logits, targets)

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
    def accuracy(self, model: nn.Module, loader: DataLoader[object], on_batch: Callable[[], None] | None = None) -> float:
        import torchmetrics

        metric = torchmetrics.Accuracy(task="multiclass", num_classes=self.recipe.workload.num_classes)
        metric = metric.to(self.device)
        model.eval()
        for inputs, targets in self.batches(loader):
            if on_batch is not None:
                on_batch()
            predicted = torch.argmax(self.recipe.workload.logits(model, inputs), 1)
            metric.update(predicted, targets)
        return float(metric.compute())

    def evaluation(self, model: nn.Module, loader: DataLoader[object]) -> dict[str, float]:
        model.eval()
        return evaluation.evaluate(lambda inputs: self.recipe.workload.logits(model, inputs), self.batches(loader),
                                   self.recipe.workload.num_classes, self.device)


def follow_parameters(optimizer: torch.optim.Optimizer, before: list[nn.Parameter], after: list[nn.Parameter]) -> None:
    """Point ``optimizer``'s parameter groups (no state yet) from the parameters ``before`` setup to those that
    replaced them ``after`` it, by position: parallelize_module and fully_shard re-register each parameter under
    its own name, so the order stays, and a DTensor has its whole tensor's shape."""
    if len(before) != len(after) or any(a.shape != b.shape for a, b in zip(after, before)):
        # A library change, not the user's choice: no UsageError.
        raise RuntimeError(f"setup changed the model's parameters ({len(before)} -> {len(after)}, or their shapes): "
                           "the optimizer cannot follow them")
    replaced = {id(b): a for b, a in zip(before, after)}
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(id(p), p) for p in group["params"]]


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


def run(recipe: Recipe, options: RunOptions, probe: probe_module.Probe | None = None,
        engine: Callable[[Recipe, RunOptions], pipeline.Engine] | None = None) -> Record:
    """Run ``recipe`` once in this process (one device, or this rank of a CUDA FSDP run); ``engine``: the engine of
    the recipe's stack (memclaims.run.run_recipe picks it), else Fabric's (plain PyTorch's)."""
    check_device(options.device)
    if engine is None and recipe.stack_hooks is not None:
        raise UsageError(f"{recipe.id} runs on the {recipe.stack} stack's engine: run it with memclaims.run.run_recipe")
    strategy = recipe.distributed
    if strategy is not None and options.device not in strategy.lightning_devices:
        # Lightning refuses FSDP on the CPU; memclaims.measure.distributed shards with FSDP2 over gloo.
        raise UsageError(f"{recipe.id} is sharded: run it with memclaims.run.run_recipe")
    memory_steps = resolve_memory_steps(recipe, options)
    probe = probe or probe_module.make_probe(options.device)
    matmul_precision, threads = torch.get_float32_matmul_precision(), torch.get_num_threads()
    if recipe.scale.name in SINGLE_THREADED_SCALES:
        # Smoke-scale matmuls are too small to gain from intra-op threads, and idle threads
        # spin-waiting on a shared 2-core machine made them 10x slower.
        torch.set_num_threads(1)
    try:
        from memclaims.measure.determinism import deterministic

        # CUDA only: accuracy run to run; around it what a technique sets for the run (an allocator setting).
        with deterministic(options.device) as determinism_notes, ExitStack() as around:
            for hooks in recipe.hooks:
                if not isinstance(hooks, SetsAllocator):
                    continue
                context = hooks.run_context(recipe, options, getattr(probe, "cuda", None))
                if context is not None:
                    around.enter_context(context)
            record = pipeline.measure((engine or FabricEngine)(recipe, options), probe, memory_steps)
        record.notes.extend(determinism_notes)
        return record
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as error:
        requested = out_of_memory_request(error)
        if requested is None and not isinstance(error, (torch.OutOfMemoryError, MemoryError)):
            raise
        phase = failed_phase(probe.phases)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise OutOfMemory(recipe.id, options.device, phase, requested if requested else None, first_line) from error
    finally:
        torch.set_float32_matmul_precision(matmul_precision)
        # Restore the thread count only if it changed. torch.set_num_threads creates caffe2's
        # pthreadpool, with that many threads, on its first call in a process (pytorch#134714), and
        # the pthreadpool bundled up to torch 2.9 (Maratyszcza/pthreadpool, src/pthreads.c) ignores
        # pthread_create's result, then futex-waits for every worker to check in. After a CPU
        # out-of-memory under an address-space cap (ulimit -v) no thread stack can be mapped, so an
        # unconditional restore hung forever instead of reporting the OutOfMemory. (Later torch
        # bundles google/pthreadpool, whose pthreadpool_create does not wait for its workers.)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
