"""deepspeed-zero2: DeepSpeed ZeRO stage 2 through Lightning's DeepSpeedStrategy (the LLM bonus's
bonus_distilbert-before): optimizer state, fp32 master weights and gradients partitioned over the ranks. Lightning's
strategy on CUDA ranks (it refuses the CPU); on the sim ``memclaims.sim.replays.zero``'s accounting. What shows it: no
rank holds more than its partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.techniques.base import Say, StandIn, Strategy, StrategyPlan, Technique

if TYPE_CHECKING:
    from lightning.fabric.strategies import Strategy as FabricStrategy

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.workloads.types import Workload

# Lightning Fabric's DeepSpeedStrategy refuses every accelerator but CUDA (lightning 2.6,
# fabric/strategies/deepspeed.py: "only supported on CUDA GPUs"), whatever DeepSpeed's own CPU accelerator does.
DEEPSPEED_ON_CPU = "Lightning's DeepSpeedStrategy runs on CUDA GPUs only (it refuses Fabric's CPU accelerator)"

# ZeRO stage 2 per rank: the fp32 master copy and Adam's two fp32 states (12 B per parameter) and the
# fp32 gradient partition (4 B) are each 1/N of the model's; flat-buffer padding adds at most a few
# elements per rank, so 1 % above 1/N is already more than a partition holds.
ZERO2_STATE_BYTES_PER_PARAMETER = 12
ZERO2_GRAD_BYTES_PER_PARAMETER = 4
ZERO2_SLACK = 1.01


class DeepSpeedZero2(Strategy):
    sim_replay = "memclaims.sim.replays.zero:ZeroReplay"

    def lightning_strategy(self, plan: StrategyPlan, recipe: Recipe, device: str) -> str | FabricStrategy:
        return "deepspeed_stage_2"  # Lightning's defaults (memclaims.sim.replays.zero.LIGHTNING_DEFAULTS)

    def rank_notes(self, plan: StrategyPlan, rank: int, device: str) -> list[str]:
        return [f"rank {rank} of {plan.world}: Lightning strategy='deepspeed_stage_2'"]

    def unsupported_on(self, device: str) -> str | None:
        return DEEPSPEED_ON_CPU if device == "cpu" else None

    def rank_refusal(self, recipe: Recipe, device: str, world: int) -> str | None:
        refused = self.unsupported_on(device)
        return f"{recipe.id}: {refused}; use --device cuda or --device sim" if refused else None

    def sim_refusal(self, recipe: Recipe) -> str | None:
        if recipe.precision in ("16-mixed", "bf16-mixed") and recipe.optimizer == "adam":
            return None
        return ("its DeepSpeed ZeRO-2 accounting (memclaims.sim.replays.zero) covers 16-mixed or bf16-mixed with Adam, as "
                "bonus_distilbert-before ran")

    def stand_in(self, workload: Workload, device: str) -> StandIn | None:
        refused = self.unsupported_on(device)
        if refused is None:
            return None
        return StandIn(f"without DeepSpeed ZeRO-2 on one process ({refused})", dropped=True,
                       refused=f"DeepSpeed ZeRO-2: {refused}")

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        if record.devices == 1:
            return
        world = record.devices
        for field_name, per_parameter, what in (
                ("optimizer_state_bytes", ZERO2_STATE_BYTES_PER_PARAMETER, "fp32 master weights and Adam state"),
                ("grad_bytes", ZERO2_GRAD_BYTES_PER_PARAMETER, "fp32 gradient partition")):
            held = getattr(record, field_name)
            share = per_parameter * record.param_count / world
            if held > share * ZERO2_SLACK:
                say(f"rank {record.rank} holds {field_name} {held:,} B, above 1/{world} of the model's {what} "
                    f"({share:,.0f} B): ZeRO-2 partitions them over the ranks")


ENTRY = Technique("deepspeed-zero2", "DeepSpeed ZeRO stage 2 through Lightning's DeepSpeedStrategy: optimizer "
                  "state, fp32 master weights and gradients partitioned over the ranks", "bonus_distilbert-before",
                  group="strategy", requires=frozenset({"deepspeed"}), hooks=DeepSpeedZero2())
