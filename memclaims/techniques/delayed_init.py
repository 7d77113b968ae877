"""delayed-init: the model built inside ``fabric.init_module(empty_init=False)`` under FSDP (article 11,
logs only). The CUDA FSDP rank's Fabric engine builds through ``init_context``; the CPU ranks and the sim's
FSDP replay build the model themselves, on the host either way: the plan's notes say so."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memclaims.techniques.engine_protocols import FabricRun

from memclaims.techniques.base import ON_CPU_RANKS, ON_SIM, Hooks, StrategyPlan, Technique


class DelayedInit(Hooks):
    def init_context(self, engine: FabricRun) -> AbstractContextManager[object] | None:
        context: AbstractContextManager[object] = engine.fabric.init_module(empty_init=False)
        return context

    def plan_strategy(self, plan: StrategyPlan) -> StrategyPlan:
        return plan.noted(ON_CPU_RANKS, "delayed-init changes nothing on the CPU: the model is built on the CPU either "
                                        "way").noted(
            ON_SIM, "init_module(empty_init=False) under FSDPStrategy builds on the host (no device context): the load "
                    "replays as without it")


ENTRY = Technique("delayed-init", "model built inside fabric.init_module(empty_init=False) under FSDP",
                  "11_delay-allocation (logs only)", needs=frozenset({"fsdp"}), hooks=DelayedInit())
