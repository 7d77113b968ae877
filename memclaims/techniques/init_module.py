"""init-module: the model built on the target device in the target precision inside Fabric's
``init_module`` (article 07-03), against 07-01's reference (built on the CPU in fp32, then converted).

The reference load is measured in the same run (the Record's ``reference_load_peak_bytes``); building in
place must lower the load peak (``check``). The CPU ranks build the model themselves, on the CPU: the plan's note
says it changes nothing there.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import ON_CPU_RANKS, TRUE_HALF_PRECISIONS, Hooks, Say, StrategyPlan, Technique

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import FabricRun, PhaseProbe


class InitModule(Hooks):
    def init_context(self, engine: FabricRun) -> AbstractContextManager[object] | None:
        if "delayed-init" in engine.recipe.techniques:  # its own init_module(empty_init=False) builds the model
            return None
        context: AbstractContextManager[object] = engine.fabric.init_module()
        return context

    def reference_load(self, engine: FabricRun, probe: PhaseProbe) -> int | None:
        """07_01: build on the CPU in fp32, then ``.to(device).to(dtype)``; returns its peak."""
        from memclaims.core.precision import precision

        recipe = engine.recipe
        with probe.phase("load-reference"):
            model, _ = recipe.workload.build_model(recipe.scale)
            for hooks in recipe.hooks:  # the same model as the recipe's: with its adapters
                model = hooks.reference_module(model, recipe.workload)
            model.to(engine.device).to(precision(recipe.precision).param_dtype)
            del model
        return int(probe.phases["load-reference"].allocated_bytes)

    def plan_strategy(self, plan: StrategyPlan) -> StrategyPlan:
        return plan.noted(ON_CPU_RANKS, "init-module changes nothing on the CPU tier")

    def load_only(self) -> bool:
        return True

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        reference = record.reference_load_peak_bytes
        if reference is None:
            say("no reference load (build in fp32, then convert) was measured to compare with")
            return
        # On the CPU in fp32 there is nothing to save: the reference's .to("cpu").to(float32) copies
        # nothing. Everywhere else building in place must lower the load peak.
        must_lower = record.device != "cpu" or record.precision in TRUE_HALF_PRECISIONS
        if record.load_peak_bytes > reference or (must_lower and record.load_peak_bytes >= reference):
            say(f"load_peak_bytes {record.load_peak_bytes:,} B is not below the reference load (build in fp32, "
                f"then convert) of {reference:,} B")

    def sim_builds_on_device(self) -> bool:
        return True

    def sim_reference(self, recipe: Recipe) -> dict[str, Any] | None:
        return dict(mode="build-then-convert", workload=recipe.workload.name, scale=recipe.scale,
                    num_classes=recipe.workload.num_classes,
                    precision=recipe.precision if recipe.precision.endswith("-true") else "32-true",
                    lora="lora" in recipe.techniques)


ENTRY = Technique("init-module", "model built on the target device in the target precision inside Fabric's "
                  "init_module", "07-03_init-module", hooks=InitModule())
