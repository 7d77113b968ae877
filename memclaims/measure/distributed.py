"""Multi-device runs of a recipe with a strategy (article scripts 08-11, the LLM bonus): one Record per rank.

The recipe's strategy (``Recipe.distributed``, a ``memclaims.techniques.base.Strategy``) says how its ranks run,
and its plan (``Recipe.strategy_plan``) what they execute:

- on the devices where Lightning runs the strategy (``Strategy.lightning_devices``: FSDP on CUDA, DDP and
  DeepSpeed on CUDA or CPU), every rank runs ``memclaims.measure.runner.run``, the Fabric engine, with the
  strategy's own Lightning object (``Strategy.lightning_strategy``: ``FSDPStrategy`` as the article's scripts
  configure it, ``ModelParallelStrategy`` for FSDP2, ``DDPStrategy``, ``"deepspeed_stage_2"``; the Fabric is built
  by ``memclaims.measure.lightning_fsdp``) over NCCL or gloo;
- elsewhere (FSDP on the CPU: Lightning refuses it) ``CpuShardedEngine`` executes the plan itself over gloo, as
  Lightning's ``ModelParallelStrategy`` would, the plan as Lightning's own strategy configures it
  (``Strategy.configured``: for FSDP, what ``FSDPStrategy`` and its ``FSDPPrecision`` would pass to FSDP): the plan's
  device mesh, then the strategy's ``parallelize`` (for FSDP, FSDP2's ``fully_shard`` on each unit of Lightning's
  auto-wrap policy, then the root, under its MixedPrecision), measured by the exact CPU probe on every rank
  through ``memclaims.measure.pipeline``. Each rank trains on its slice of the same global batch as the
  single-process run, so the mean loss is the single-process loss.

``memclaims.run.run_recipe`` comes here for a recipe with a strategy; ``run_distributed_many`` runs
several recipes in one process group.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.core.precision import PRECISIONS, precision
from memclaims.core.record import Record, device_name
from memclaims.measure import launcher, pipeline
from memclaims.measure.probes import CpuProbe
from memclaims.recipes.recipe import parse_id
from memclaims.recipes.run_options import (
    DEFAULT_TIMEOUT_S,
    RunOptions,
    check_device,
    default_devices,
    resolve_memory_steps,
)
from memclaims.techniques.base import FSDP2_API, ON_CPU_RANKS

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from memclaims.recipes.recipe import Recipe

# --- the result -------------------------------------------------------------------------------


@dataclass
class DistributedResult:
    """The Records of every rank of one run; rank 0 is the article's figure."""

    recipe: str
    device: str
    devices: int
    launcher: str  # "spawn" (this package started the ranks) or "torchrun"
    records: list[Record]

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> DistributedResult:
        """The result of ``measure``'s Records of one sharded run."""
        return cls(recipe=records[0].recipe, device=records[0].device, devices=records[0].devices,
                   launcher="torchrun" if launcher.torchrun_env() else "spawn", records=list(records))

    @property
    def rank0(self) -> dict[str, object]:
        return self.records[0].to_dict()

    @property
    def max_over_ranks(self) -> dict[str, object]:
        """Per measured key (bytes, seconds, breakdown categories), the largest value of any rank."""
        result: dict[str, object] = {}
        dicts = [r.to_dict() for r in self.records]
        for key, value in dicts[0].items():
            # Numbers only: host_state_bytes is a dict by category, not one figure.
            if (key.endswith("_bytes") or key.endswith("_s")) and not isinstance(value, (bool, dict)):
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


def run_distributed(recipe: Recipe, options: RunOptions, devices: int | None = None, *,
                    timeout_s: float | None = DEFAULT_TIMEOUT_S) -> DistributedResult:
    """Run a sharded ``recipe`` on ``devices`` ranks (None: ``options.devices``, else 2 CPU
    processes or every visible GPU) and gather one Record per rank."""
    return run_distributed_many([recipe], options, devices, timeout_s=timeout_s)[0]


def run_distributed_many(recipes: Sequence[Recipe], options: RunOptions, devices: int | None = None, *,
                         timeout_s: float | None = DEFAULT_TIMEOUT_S) -> list[DistributedResult]:
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
    per_rank = launcher.launch(rank_main, world, ([r.id for r in recipes], options),
                               backend="nccl" if options.device == "cuda" else "gloo", timeout_s=timeout_s)
    return [
        DistributedResult(recipe=recipe.id, device=options.device, devices=world,
                          launcher="torchrun" if env else "spawn",
                          records=[Record.from_dict(per_rank[rank][index]) for rank in range(world)])
        for index, recipe in enumerate(recipes)
    ]


def check_distributed(recipe: Recipe, device: str, devices: int, local: bool = True) -> None:
    """What a distributed run refuses up front, as one-line usage errors (``local``: every rank
    runs on this machine): the recipe's own (its techniques' ``rank_refusal``), then what the CPU ranks'
    sharded engine needs of a recipe it runs (the micro-batch split over the ranks)."""
    strategy = recipe.distributed
    if strategy is None:
        raise UsageError(f"{recipe.id} runs on one device: a distributed run needs a multi-device technique "
                         "('fsdp', 'ddp' or 'deepspeed-zero2')")
    if devices < 1:
        raise UsageError(f"--devices must be at least 1 (got {devices})")
    if device == "cuda" and local and devices > torch.cuda.device_count():
        raise UsageError(f"--devices {devices} needs {devices} CUDA devices; torch sees {torch.cuda.device_count()}")
    # The strategy's own reasons after the others' (what the device cannot do at all before how the ranks split).
    for hooks in sorted(recipe.hooks, key=lambda hooks: hooks is strategy):
        refused = hooks.rank_refusal(recipe, device, devices)
        if refused:
            raise UsageError(refused)
    if device not in strategy.lightning_devices and recipe.micro_batch_size % devices:
        raise UsageError(
            f"{recipe.id}: micro-batch {recipe.micro_batch_size} does not split evenly over "
            f"{devices} ranks; choose --devices that divides it"
        )


def rank_main(rank: int, world: int, recipe_ids: list[str], options: RunOptions) -> list[dict[str, Any]]:
    """One rank: every recipe in turn; Records as dicts (plain data crosses process boundaries). ``launcher.launch``'s
    rank function (a test that changes a library in every rank wraps it: fixtures/injections.py)."""
    results = []
    for recipe_id in recipe_ids:
        recipe = parse_id(recipe_id)
        strategy = recipe.distributed
        assert strategy is not None  # check_distributed
        if options.device in strategy.lightning_devices:
            # Lightning's own strategy: each rank trains on its own batch of the recipe's size from Fabric's
            # DistributedSampler.
            from memclaims.measure import runner

            record = runner.run(recipe, options)
            plan = recipe.strategy_plan(world)
            record.fsdp_api = plan.fsdp_api
            record.notes.extend(strategy.rank_notes(plan, rank, options.device))
        else:
            record = pipeline.measure(CpuShardedEngine(recipe, options, rank, world), CpuProbe(),
                                  resolve_memory_steps(recipe, options))
        record.devices, record.rank = world, rank
        results.append(record.to_dict())
    return results


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


def unsharded_params(model: nn.Module) -> int:
    """Parameter elements of ``model`` that are plain tensors, not FSDP2's DTensor shards: what is gathered."""
    from torch.distributed.tensor import DTensor

    return sum(p.numel() for p in model.parameters() if not isinstance(p, DTensor))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of a DTensor (parameters, gradients, optimizer state), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _cast_floating(batch: Any, dtype: torch.dtype) -> object:
    if isinstance(batch, dict):
        return {k: _cast_floating(v, dtype) for k, v in batch.items()}
    return batch.to(dtype) if batch.is_floating_point() else batch


def _rank_slice(batch: Any, rank: int, world: int) -> Any:
    """This rank's contiguous share of a global (micro-)batch."""
    if isinstance(batch, dict):
        return {k: _rank_slice(v, rank, world) for k, v in batch.items()}
    share = batch.shape[0] // world
    return batch[rank * share:(rank + 1) * share]


class CpuShardedEngine(pipeline.Engine):
    """One rank of a strategy Lightning does not run on the CPU (FSDP), executing the recipe's plan over gloo: the
    plan's device mesh, the strategy's ``parallelize`` on the model, every rank's slice of the global batch."""

    declares_schedule = False

    def __init__(self, recipe: Recipe, options: RunOptions, rank: int, world: int) -> None:
        super().__init__(recipe, options)
        self.rank, self.world = rank, world
        strategy = recipe.distributed
        assert strategy is not None  # check_distributed
        self.spec = precision(recipe.precision)
        # What Lightning's strategy and precision plugin configure for the recipe (FSDPStrategy + FSDPPrecision, paired
        # with the precision the CPU runs: Lightning has no float16 AMP there), as the plan these ranks execute.
        self.strategy = strategy
        self.plan = strategy.configured(recipe.strategy_plan(world), recipe, self.spec.cpu_name)
        self.notes.extend(strategy.rank_notes(self.plan, rank, "cpu"))
        # Parameter elements held unsharded after the first measured forward pass (forward_loss).
        self.forward_unsharded_params: int | None = None
        if self.precision_ran != recipe.precision:
            self.notes.append(f"ran {recipe.precision} as {self.precision_ran} on cpu")
        self.notes.extend(self.plan.notes_on(ON_CPU_RANKS))

    @property
    def precision_ran(self) -> str:
        return self.spec.cpu_name  # as Lightning would run it on the CPU

    def device_name(self) -> str:
        return device_name("cpu")

    def build(self) -> tuple[nn.Module, str]:
        model, weights = self.recipe.workload.build_model(self.recipe.scale)
        if self.spec.true_half:
            model = model.to(self.spec.param_dtype)
        return self.shard(model), weights

    def shard(self, model: nn.Module) -> nn.Module:
        """The strategy's ``parallelize`` on the model, over the plan's device mesh (torch lets the CPU ranks form
        one over gloo: HYBRID_SHARD's simulated nodes), as Lightning's ModelParallelStrategy calls its
        parallelize_fn."""
        mesh = None
        if self.plan.mesh_shape is not None:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", self.plan.mesh_shape, mesh_dim_names=self.plan.mesh_dim_names)
        return self.strategy.parallelize(self.plan, model, mesh, self.recipe.workload)

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        return _local(tensor)

    def logits(self, model: nn.Module, inputs: object) -> torch.Tensor:
        """As Fabric's module wrapper: floating inputs in a true-half recipe's dtype, autocast for
        mixed precision, logits back in float32."""
        dtype = self.spec.input_dtype(fsdp=True)
        if dtype is not None:
            inputs = _cast_floating(inputs, dtype)
        autocast = PRECISIONS[self.precision_ran].autocast_dtype
        context = torch.autocast("cpu", dtype=autocast) if autocast is not None else nullcontext()
        with context:
            return self.recipe.workload.logits(model, inputs).float()  # casts_output, a no-op for 32-true

    def forward_loss(self, model: nn.Module, inputs: object, targets: torch.Tensor) -> torch.Tensor:
        """The loss of this rank's share of the global micro-batch; after the first forward pass, how
        many parameter elements FSDP2 left unsharded (it swaps a module's DTensor shards for plain
        unsharded parameters while they are gathered)."""
        share = _rank_slice(inputs, self.rank, self.world), _rank_slice(targets, self.rank, self.world)
        loss = F.cross_entropy(self.logits(model, share[0]), share[1])
        if self.forward_unsharded_params is None and model.training:
            self.forward_unsharded_params = unsharded_params(model)
        return loss

    def measured_fields(self) -> dict[str, object]:
        return {**super().measured_fields(), "forward_unsharded_params": self.forward_unsharded_params,
                "fsdp_api": FSDP2_API}  # fully_shard, whichever FSDP the recipe asked for (rank_notes say so)

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
    def accuracy(self, model: nn.Module, loader: DataLoader[object], on_batch: Callable[[], None] | None = None) -> float:
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
