"""ddp (distributed data parallel): the LLM bonus "before" scripts: the whole model on every rank, gradients
all-reduced in buckets (Lightning's DDPStrategy passes no DDP options: torch's 25 MiB buckets, no bucket views).
Lightning's ``DDPStrategy`` runs it on CUDA and CPU ranks; the sim replays a rank as one device with the Reducer's
buckets (the plan's ``bucket_gradients``, memclaims.sim.ddp). What shows it: every rank holds the whole model,
and the ranks' gradients, hashed after the first backward (``attach``: the loop's ``digests_gradients``), agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import (
    ON_SIM,
    TRUE_HALF_PRECISIONS,
    Say,
    StandIn,
    Strategy,
    StrategyPlan,
    Technique,
)

if TYPE_CHECKING:
    import torch
    from lightning.fabric.strategies import Strategy as FabricStrategy
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import RealRun
    from memclaims.workloads.types import Workload


class Ddp(Strategy):
    def plan(self, recipe: Recipe, world: int) -> StrategyPlan:
        return StrategyPlan(world=world, bucket_gradients=True).noted(
            ON_SIM, "DDP rank (memclaims.sim.ddp): the whole model, gradients and optimizer state, plus gradient buckets "
                    "of torch's default caps (gradient_as_bucket_view=False, as Lightning sets it); not modelled: "
                    "gloo/NCCL buffers")

    def lightning_strategy(self, plan: StrategyPlan, recipe: Recipe, device: str) -> str | FabricStrategy:
        """``"ddp"`` by name, with Lightning's defaults (torch's 25 MiB buckets, ``gradient_as_bucket_view=False``),
        but where the workload or the CPU ranks need a DDP option."""
        from lightning.fabric.strategies import DDPStrategy

        ddp: dict[str, Any] = {}
        if recipe.workload.unused_parameters:
            # Only where the workload leaves parameters without gradients (BigBird's pooler): the script's
            # plain "ddp" fails there at the second step ("Expected to have finished reduction in the prior
            # iteration"); the search for them walks the autograd graph each step and allocates nothing.
            ddp["find_unused_parameters"] = True
        if device == "cpu":
            ddp["init_sync"] = False  # the states are broadcast in place instead (before_setup)
        return DDPStrategy(**ddp) if ddp else "ddp"

    def rank_notes(self, plan: StrategyPlan, rank: int, device: str) -> list[str]:
        return [f"rank {rank} of {plan.world}: Lightning strategy='ddp'"]

    def stand_in(self, workload: Workload, device: str) -> StandIn | None:
        if workload.unused_parameters:
            return StandIn(f"DDPStrategy(find_unused_parameters=True): {workload.name} has parameters that get no "
                           "gradient")
        return None

    def attach(self, engine: RealRun) -> None:
        engine.digests_gradients = True  # the ranks compare them (rank_check)

    def before_setup(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """DDP's start on gloo (CPU ranks), made deterministic: every parameter and buffer broadcast from rank 0
        in place, one tensor at a time, before ``DistributedDataParallel`` is built with ``init_sync=False``
        (``lightning_strategy``).

        DDP's own sync (``_broadcast_coalesced``) flattens the states into one bucket, a parameter-sized copy
        that the gloo worker thread frees after the broadcast completes; whether that happens before the main
        thread allocates the reducer's gradient buckets is a race, so a rank's load peak was either 2x or 3x
        its parameters (1 run in 9 failed its baseline by +50 %). In place, nothing is allocated: the load peak
        is DDP's when the bucket is freed first (parameters and the reducer's buckets), on every run."""
        if engine.options.device != "cpu":
            return
        import torch.distributed as dist

        for tensor in (*model.parameters(), *model.buffers()):
            dist.broadcast(tensor.data, src=0)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        if record.devices == 1:
            return
        full = record.param_count * (2 if record.precision in TRUE_HALF_PRECISIONS else 4)
        if record.param_bytes != full:
            say(f"rank {record.rank} holds {record.param_bytes:,} B of parameters, not the whole model's {full:,} B: "
                "DDP replicates the model on every rank")
        if record.grad_digest is None:
            say(f"rank {record.rank} recorded no gradient digest: nothing shows an all-reduce")

    def rank_check(self, records: Sequence[Record]) -> list[str]:
        """The gradients, all-reduced, are bit for bit the same on every rank after the backward (each rank's
        own batch gave different local ones)."""
        ranks = [r for r in records if r.devices > 1]
        digests = {r.rank: r.grad_digest for r in ranks}
        if len(set(digests.values())) > 1:
            return [f"{ranks[0].recipe}: ddp is not active: the ranks' gradients differ after the backward "
                    f"(SHA-256 by rank: {digests}); DDP all-reduces them"]
        return []


ENTRY = Technique("ddp", "distributed data parallel: the whole model, gradients and optimizer state on every "
                  "rank, gradients all-reduced", "bonus_bigbird-before", group="strategy", hooks=Ddp())
