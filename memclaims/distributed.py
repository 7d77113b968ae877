"""Multi-device runs of a sharded recipe (article scripts 08-11): one Record per rank.

- CUDA: every rank runs ``memclaims.runner.run`` with Lightning Fabric's ``FSDPStrategy``
  (auto-wrap and activation checkpointing on the workload's block class, ``cpu_offload``), as the
  article's scripts do; the processes come from ``memclaims.launcher`` (or torchrun), which sets
  torchrun's variables, so Fabric's own launcher sees processes created externally and starts none.
- CPU: Lightning refuses FSDP on the CPU, so the same smoke model is sharded with PyTorch's FSDP2
  (``fully_shard`` on each block, then the root) over gloo and measured by the exact CPU probe on
  every rank. Each rank trains on its slice of the same global batch as the single-process run,
  so the mean loss is the single-process loss.

The public entry point is ``run_distributed(recipe, options, devices)``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memclaims import launcher
from memclaims.errors import UsageError
from memclaims.loop import TrainingLoop
from memclaims.recipe import Recipe, parse_id
from memclaims.record import Record, device_name, environment_facts, library_versions
from memclaims.runner import TRUE_HALF, RunOptions, check_device, resolve_memory_steps

CPU_DEFAULT_DEVICES = 2
MIXED = ("16-mixed", "bf16-mixed")


# --- the result -------------------------------------------------------------------------------


@dataclass
class DistributedResult:
    """The Records of every rank of one run; rank 0 is the article's figure."""

    recipe: str
    device: str
    devices: int
    launcher: str  # "spawn" (this package started the ranks) or "torchrun"
    records: list[Record]

    @property
    def rank0(self) -> dict[str, Any]:
        return self.records[0].to_dict()

    @property
    def max_over_ranks(self) -> dict[str, Any]:
        """Per measured key (bytes, seconds, breakdown categories), the largest value of any rank."""
        result: dict[str, Any] = {}
        dicts = [r.to_dict() for r in self.records]
        for key, value in dicts[0].items():
            if (key.endswith("_bytes") or key.endswith("_s")) and not isinstance(value, bool):
                values = [d[key] for d in dicts if isinstance(d[key], (int, float))]
                result[key] = max(values) if values else None
        categories = sorted({c for d in dicts for c in d["breakdown"]})
        result["breakdown"] = {c: max(d["breakdown"].get(c, 0) for d in dicts) for c in categories}
        return result

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "device": self.device,
            "devices": self.devices,
            "launcher": self.launcher,
            "ranks": [r.to_dict() for r in self.records],
            "rank0": self.rank0,
            "max_over_ranks": self.max_over_ranks,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# --- entry points -----------------------------------------------------------------------------


def default_devices(device: str) -> int:
    if device == "cuda":
        return max(1, torch.cuda.device_count())
    return CPU_DEFAULT_DEVICES


def run_distributed(recipe: Recipe, options: RunOptions, devices: int | None = None, *,
                    timeout_s: float | None = launcher.DEFAULT_TIMEOUT_S) -> DistributedResult:
    """Run a sharded ``recipe`` on ``devices`` ranks (None: ``options.devices``, else 2 CPU
    processes or every visible GPU) and gather one Record per rank."""
    return run_distributed_many([recipe], options, devices, timeout_s=timeout_s)[0]


def run_distributed_many(recipes: Sequence[Recipe], options: RunOptions, devices: int | None = None, *,
                         timeout_s: float | None = launcher.DEFAULT_TIMEOUT_S) -> list[DistributedResult]:
    """Several recipes, one after the other, in one process group: starting ranks costs seconds
    (every child imports torch), so a test module pays it once for all its configurations."""
    check_device(options.device)
    env = launcher.torchrun_env()
    world = devices or options.devices or (env.world_size if env else default_devices(options.device))
    for recipe in recipes:
        # Under torchrun the ranks may span nodes: this node's GPU count says nothing then.
        check_distributed(recipe, options.device, world, local=env is None)
    options = replace(options, devices=world)
    if options.device == "cuda" and torch.cuda.is_initialized():
        # This process's cached blocks on GPU 0 (an earlier single-GPU case) would crowd rank 0.
        torch.cuda.empty_cache()
    per_rank = launcher.launch(_rank_main, world, ([r.id for r in recipes], options),
                               backend="nccl" if options.device == "cuda" else "gloo", timeout_s=timeout_s)
    return [
        DistributedResult(recipe=recipe.id, device=options.device, devices=world,
                          launcher="torchrun" if env else "spawn",
                          records=[Record.from_dict(per_rank[rank][index]) for rank in range(world)])
        for index, recipe in enumerate(recipes)
    ]


def check_distributed(recipe: Recipe, device: str, devices: int, local: bool = True) -> None:
    """What a distributed run refuses up front, as one-line usage errors (``local``: every rank
    runs on this machine)."""
    if not recipe.sharded:
        raise UsageError(f"{recipe.id} is not sharded: a distributed run needs the technique 'fsdp'")
    if devices < 1:
        raise UsageError(f"--devices must be at least 1 (got {devices})")
    if device == "cuda" and local and devices > torch.cuda.device_count():
        raise UsageError(f"--devices {devices} needs {devices} CUDA devices; torch sees {torch.cuda.device_count()}")
    if device == "cpu":
        if recipe.cpu_offload:
            raise UsageError(f"{recipe.id}: cpu-offload moves parameters off a GPU and needs --device cuda")
        if recipe.plain_pytorch:
            raise UsageError(f"{recipe.id}: the plain PyTorch loop does not shard")
        if recipe.micro_batch_size % devices:
            raise UsageError(
                f"{recipe.id}: micro-batch {recipe.micro_batch_size} does not split evenly over "
                f"{devices} ranks; choose --devices that divides it"
            )


def _rank_main(rank: int, world: int, recipe_ids: list[str], options: RunOptions) -> list[dict[str, Any]]:
    """One rank: every recipe in turn; Records as dicts (plain data crosses process boundaries)."""
    results = []
    for recipe_id in recipe_ids:
        recipe = parse_id(recipe_id)
        if options.device == "cuda":
            from memclaims import runner

            record = runner.run(recipe, options)
            record.notes.append(f"rank {rank} of {world}: Lightning FSDPStrategy")
        else:
            record = CpuShardedRun(recipe, options, rank, world).run()
        record.devices, record.rank = world, rank
        results.append(record.to_dict())
    return results


# --- CUDA: Lightning Fabric -------------------------------------------------------------------


def fsdp_strategy(recipe: Recipe) -> Any:
    """Scripts 08/09/11: wrap and checkpoint the workload's block, optionally offload to the CPU."""
    from lightning.fabric.strategies import FSDPStrategy

    block = recipe.workload.block_class()
    return FSDPStrategy(
        auto_wrap_policy={block} if recipe.workload.fsdp_auto_wrap else None,
        activation_checkpointing_policy={block} if recipe.activation_checkpointing else None,
        cpu_offload=recipe.cpu_offload,
    )


def sharded_fabric(recipe: Recipe, options: RunOptions) -> Any:
    """The Fabric one rank of a sharded CUDA run uses (``memclaims.runner`` calls this)."""
    import os

    from lightning.fabric import Fabric

    world = options.devices or default_devices(options.device)
    # torchrun across nodes: Fabric counts devices per node.
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    environment = cluster_environment()
    fabric = Fabric(accelerator=options.device, devices=per_node, num_nodes=max(1, world // per_node),
                    strategy=fsdp_strategy(recipe), precision=recipe.precision,
                    plugins=[environment] if environment is not None else None)
    # The processes exist already (LOCAL_RANK is set): launch() only joins the group and picks
    # this rank's GPU.
    fabric.launch()
    return fabric


def cluster_environment(environ: Mapping[str, str] | None = None) -> Any:
    """The Lightning cluster environment of a rank, chosen here rather than detected by Lightning.

    Lightning tries SLURMEnvironment first; inside a SLURM allocation it would win for ranks that
    memclaims spawned (every rank global rank 0) and for torchrun's workers (SLURM_PROCID is the
    srun task, not the worker). Spawned ranks: LightningEnvironment (RANK/LOCAL_RANK set by
    memclaims.launcher); torchrun: TorchElasticEnvironment; otherwise None (Lightning decides).
    """
    env = os.environ if environ is None else environ
    if env.get(launcher.SPAWNED_RANK_ENV):
        from lightning.fabric.plugins.environments import LightningEnvironment

        return LightningEnvironment()
    if env.get("TORCHELASTIC_RUN_ID") is not None or launcher.torchrun_env(env) is not None:
        from lightning.fabric.plugins.environments import TorchElasticEnvironment

        return TorchElasticEnvironment()
    return None


def environment_report(rank: int, world: int) -> dict[str, Any]:
    """What one spawned rank sees: left-over SLURM variables, and the cluster environment and ranks
    Lightning Fabric sets up with memclaims' choice (a rank function for launcher.launch)."""
    from lightning.fabric import Fabric

    chosen = cluster_environment()
    fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp",
                    plugins=[chosen] if chosen is not None else None)
    return {"rank": rank, "slurm": sorted(k for k in os.environ if k.startswith("SLURM_")),
            "environment": type(fabric.strategy.cluster_environment).__name__,
            "global_rank": fabric.global_rank, "local_rank": fabric.local_rank, "world_size": fabric.world_size}


# --- CPU: FSDP2 over gloo ---------------------------------------------------------------------


def shard_rows(dim0: int, world: int, rank: int) -> tuple[int, int]:
    """FSDP2's dim-0 split of a parameter: (rows this rank holds, rows its padded storage has).

    FSDP2 pads dim 0 up to a multiple of ``world`` and gives each rank ``ceil(dim0 / world)``
    rows of storage; the last ranks hold fewer real rows (possibly none) in that storage.
    """
    padded = math.ceil(dim0 / world)
    held = max(0, min(padded, dim0 - rank * padded))
    return held, padded


def expected_shard_bytes(shapes: Sequence[Sequence[int]], itemsize: int, world: int, rank: int) -> dict[str, int]:
    """Exact per-rank bytes of FSDP2-sharded parameters of these shapes, with Adam's state.

    parameters and gradients live in padded storages: sum(ceil(d0 / N) x rest x itemsize);
    Adam's ``exp_avg``/``exp_avg_sq`` are ``zeros_like`` of the unpadded local shard:
    sum(2 x held_rows x rest x itemsize), plus one fp32 ``step`` scalar per parameter on every rank.
    """
    padded_bytes = held_bytes = 0
    for shape in shapes:
        dims = list(shape) or [1]
        rest = math.prod(dims[1:])
        held, padded = shard_rows(dims[0], world, rank)
        padded_bytes += padded * rest * itemsize
        held_bytes += held * rest * itemsize
    return {
        "param_bytes": padded_bytes,
        "grad_bytes": padded_bytes,
        "optimizer_state_bytes": 2 * held_bytes + 4 * len(shapes),
    }


def _seed_everything(seed: int) -> None:
    """What ``lightning``'s ``seed_everything`` does to the generators, without importing Lightning
    (which costs each spawned rank many seconds): the model's initial weights are the runner's."""
    import os
    import random

    import numpy

    os.environ["PL_GLOBAL_SEED"] = str(seed)
    os.environ["PL_SEED_WORKERS"] = "0"
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator, CUDA's included


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of a DTensor (parameters, gradients, optimizer state), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _cast_floating(batch: Any, dtype: torch.dtype) -> Any:
    if isinstance(batch, dict):
        return {k: _cast_floating(v, dtype) for k, v in batch.items()}
    return batch.to(dtype) if batch.is_floating_point() else batch


def _rank_slice(batch: Any, rank: int, world: int) -> Any:
    """This rank's contiguous share of a global (micro-)batch."""
    if isinstance(batch, dict):
        return {k: _rank_slice(v, rank, world) for k, v in batch.items()}
    share = batch.shape[0] // world
    return batch[rank * share:(rank + 1) * share]


class CpuShardedRun(TrainingLoop):
    """One rank of a CPU FSDP2 run; mirrors ``memclaims.runner``'s phases and shares its loop."""

    def __init__(self, recipe: Recipe, options: RunOptions, rank: int, world: int) -> None:
        super().__init__(recipe.accumulation_steps)
        self.recipe, self.options, self.rank, self.world = recipe, options, rank, world
        self.notes = [f"rank {rank} of {world}: FSDP2 fully_shard over gloo on the CPU "
                      "(Lightning refuses FSDP on the CPU)"]
        # On the CPU Lightning runs 16-mixed as bf16-mixed; do the same.
        self.autocast_dtype = torch.bfloat16 if recipe.precision in MIXED else None
        self.precision_ran = "bf16-mixed" if recipe.precision in MIXED else recipe.precision
        if self.precision_ran != recipe.precision:
            self.notes.append(f"ran {recipe.precision} as {self.precision_ran} on cpu")
        if recipe.delayed_init:
            self.notes.append("delayed-init changes nothing on the CPU: the model is built on the CPU either way")
        if recipe.init_on_device:
            self.notes.append("init-module changes nothing on the CPU tier")

    def shard(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        block = self.recipe.workload.block_class()
        if self.recipe.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                apply_activation_checkpointing,
                checkpoint_wrapper,
            )

            # Non-reentrant torch.utils.checkpoint around each block, as Lightning's policy does.
            apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                           check_fn=lambda m: isinstance(m, block))
        if self.recipe.workload.fsdp_auto_wrap:
            if not any(isinstance(m, block) for m in model.modules()):
                raise UsageError(f"{self.recipe.workload.name} has no {block.__name__} to shard")
            for module in model.modules():
                # The outermost module of each block: the checkpoint wrapper when there is one.
                inner = getattr(module, "_checkpoint_wrapped_module", module)
                if isinstance(inner, block) and (module is inner) != self.recipe.activation_checkpointing:
                    fully_shard(module)
        fully_shard(model)  # the root: embeddings, final norm and head (all of it without auto-wrap)
        return model

    def run(self) -> Record:
        from torch.utils.data import DataLoader

        from memclaims import optimizers, probes

        recipe, options = self.recipe, self.options
        memory_steps = resolve_memory_steps(recipe, options)
        host = probes.HostMemory()
        host.start()
        # The same seed, data and loader as memclaims.runner: the same global batches in order.
        seed = options.seed
        _seed_everything(seed)
        bundle = recipe.workload.load_data(recipe.scale, options.data_dir)
        collate = getattr(bundle, "collate_fn", None)
        train_loader = DataLoader(bundle.train, batch_size=recipe.micro_batch_size, shuffle=True, drop_last=True,
                                  generator=torch.Generator().manual_seed(seed), collate_fn=collate)
        test_loader = DataLoader(bundle.test, batch_size=recipe.micro_batch_size, collate_fn=collate)
        steps_per_epoch = len(train_loader) // recipe.accumulation_steps
        epochs = (options.accuracy_epochs or recipe.scale.accuracy_epochs) if options.evaluate else 1

        probe = probes.CpuProbe()
        probe.prepare()
        with probe.phase("load"):
            model, weights = recipe.workload.build_model(recipe.scale)
            if recipe.precision in TRUE_HALF:
                model = model.to(TRUE_HALF[recipe.precision])
            model = self.shard(model)
            optimizer, scheduler = optimizers.build(recipe.optimizer, model, recipe.learning_rate,
                                                    epochs * steps_per_epoch,
                                                    min_8bit_size=recipe.scale.min_8bit_size)
        params = list(model.parameters())

        probe.track(model, optimizer)
        with probe.phase("train"):
            self.train(model, optimizer, scheduler, iter(train_loader), memory_steps, on_step=probe.step_begin,
                       phase=probe.step_phase)
        memory_losses = list(self.losses)
        timed = self.step_times[1:] or self.step_times  # the first step warms up
        from memclaims.runner import _observed

        observed = _observed(self, model, optimizer, recipe, local=_local)

        accuracy = None
        if options.evaluate:
            self.step_times.clear()
            for _ in range(epochs):
                self.train(model, optimizer, scheduler, iter(train_loader), -1)
            probe.track(model, optimizer)  # the model states count as live from the start
            with probe.phase("evaluation"):
                accuracy = self.accuracy(model, test_loader, on_batch=probe.step_begin)
            timed = self.step_times

        load, train = probe.phases["load"], probe.phases["train"]
        return Record(
            **recipe.record_fields(), device="cpu", device_name=device_name("cpu"),
            environment=environment_facts("cpu"),
            probe=probe.name, precision=self.precision_ran, memory_steps=memory_steps,
            param_count=sum(p.numel() for p in params),  # the whole model's, as single-process
            param_tensor_count=len(params),
            param_bytes=probes.storage_bytes(_local(p) for p in params),
            grad_bytes=self.grad_bytes or 0,
            optimizer_state_bytes=probes.storage_bytes(_local(t) for t in probes.optimizer_state_tensors(optimizer)),
            load_peak_bytes=load.allocated_bytes,
            peak_allocated_bytes=max(load.allocated_bytes, train.allocated_bytes),
            peak_reserved_bytes=None, host_peak_bytes=host.peak_bytes(), accuracy=accuracy,
            **self.loss_fields(memory_losses),
            step_time_s=statistics.median(timed) if timed else None,
            weights=weights, data=bundle.name, versions=library_versions(),
            phases=probes.phase_entries(probe.phases),
            step_peaks={name: list(peaks) for name, peaks in probe.step_peaks.items()},
            breakdown=dict(train.breakdown), notes=self.notes, **observed,
        )

    def logits(self, model: nn.Module, inputs: Any) -> torch.Tensor:
        """As Fabric's module wrapper: floating inputs in a true-half recipe's dtype, autocast for
        mixed precision, logits back in float32."""
        dtype = TRUE_HALF.get(self.recipe.precision)
        if dtype is not None:
            inputs = _cast_floating(inputs, dtype)
        context = torch.autocast("cpu", dtype=self.autocast_dtype) if self.autocast_dtype else nullcontext()
        with context:
            return self.recipe.workload.logits(model, inputs).float()

    def forward_loss(self, model: nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """The loss of this rank's share of the global micro-batch."""
        share = _rank_slice(inputs, self.rank, self.world), _rank_slice(targets, self.rank, self.world)
        return F.cross_entropy(self.logits(model, share[0]), share[1])

    def loss_value(self, loss: torch.Tensor) -> float:
        """The global batch's loss: FSDP averages gradients over ranks, and the shares are equal,
        so the mean of the ranks' losses is the single-process loss."""
        import torch.distributed as dist

        total = loss.detach().float().reshape(1).clone()
        dist.all_reduce(total)
        return float(total.item()) / self.world

    def gradients(self, model: nn.Module) -> Iterator[torch.Tensor]:
        return (_local(p.grad) for p in model.parameters() if p.grad is not None)

    @torch.no_grad()
    def accuracy(self, model: nn.Module, loader: Any, on_batch: Any = None) -> float:
        """Every rank evaluates the whole test set (each forward needs all ranks' shards)."""
        import torchmetrics

        metric = torchmetrics.Accuracy(task="multiclass", num_classes=self.recipe.workload.num_classes)
        model.eval()
        for inputs, targets in loader:
            if on_batch is not None:
                on_batch()
            metric.update(torch.argmax(self.logits(model, inputs), 1), targets)
        # Every rank saw every example: nothing to gather (torchmetrics would all-gather otherwise).
        return float(metric.compute())
