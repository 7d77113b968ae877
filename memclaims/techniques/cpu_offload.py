"""cpu-offload: FSDP's parameters offloaded to CPU memory, ``setup(move_to_device=False)`` (article 09).

Offloading parameters to host memory only means something from a GPU (``requires`` cuda; the CPU ranks refuse
it). It sets FSDP's ``CPUOffload`` in the strategy's plan (``plan_strategy``), which Lightning's FSDPStrategy and
the sim's FSDP replay execute; Fabric's setup leaves the model on the host through ``setup_options``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from memclaims.techniques.base import Hooks, Removal, Say, StandIn, StrategyPlan, Technique

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.workloads.types import Workload


class CpuOffload(Hooks):
    def setup_options(self) -> dict[str, object]:
        return {"move_to_device": False}  # FSDP moves what it needs

    def plan_strategy(self, plan: StrategyPlan) -> StrategyPlan:
        return replace(plan, offload_params=True, setup_moves_model=False)

    def rank_refusal(self, recipe: Recipe, device: str, world: int) -> str | None:
        if device == "cpu":
            return f"{recipe.id}: cpu-offload moves parameters off a GPU and needs --device cuda"
        return None

    def stand_in(self, workload: Workload, device: str) -> StandIn | None:
        if device != "cpu":
            return None
        return StandIn("no CPU offload (it moves parameters off a GPU)", dropped=True,
                       refused="CPU offload moves parameters off a GPU: needs --device cuda")

    def removes(self, after: Record) -> Removal | None:
        return Removal(state=0.0, why="offload moves the model state")

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        on_device = {d: b for d, b in record.param_bytes_by_device.items() if d != "cpu" and b}
        if on_device or not record.param_bytes_by_device.get("cpu"):
            say(f"parameter bytes by device after setup are {record.param_bytes_by_device}; offloaded parameters "
                "live on the CPU only")


ENTRY = Technique("cpu-offload", "FSDP parameters offloaded to CPU memory, setup(move_to_device=False)",
                  "09_fsdp-cpu-offload-with-01-2", needs=frozenset({"fsdp"}),
                  requires=frozenset({"cuda"}), hooks=CpuOffload())
