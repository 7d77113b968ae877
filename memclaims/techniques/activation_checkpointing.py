"""activation-checkpointing: each transformer block's activations recomputed in backward (article 08).

On one device each block is wrapped in ``torch.utils.checkpoint`` (hf: and text models through their own
``gradient_checkpointing_enable()``: ``memclaims.techniques.impl.block_checkpointing``); under a strategy that wraps
the blocks itself (FSDP) it is that strategy's policy (Lightning's ``activation_checkpointing_policy``, a
checkpoint wrapper inside each ``fully_shard``): ``plan_strategy`` asks for it in the plan.
It shows against the same recipe without it: the forward pass keeps less for the backward.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from memclaims.techniques.base import Hooks, Removal, Say, StrategyPlan, Technique

if TYPE_CHECKING:
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import RealRun



def forward_keeps_less(record: Record, without: Record | None, say: Say) -> None:
    """``say`` so unless the forward pass kept less for backward than the same recipe's without the technique (the
    active check of every checkpointing: full, selective)."""
    if without is None:
        say("no Record of the same recipe without it was given to compare with")
        return
    kept = record.phases.get("forward", {}).get("above_start_bytes")
    plain = without.phases.get("forward", {}).get("above_start_bytes")
    if kept is None or plain is None or kept >= plain:
        say(f"phases.forward.above_start_bytes (what the forward pass keeps for backward) is {kept} B with it, "
            f"{plain} B without")

class ActivationCheckpointing(Hooks):
    convert_order = 0  # the blocks as built, before a head bypass or adapters change the model

    def convert_module(self, model: nn.Module, engine: RealRun) -> nn.Module:
        strategy, stack = engine.recipe.distributed, engine.recipe.stack_hooks
        if stack is not None and stack.checkpoints_blocks:  # the stack's own switch (the HF Trainer's) does it
            return model
        if strategy is None or not strategy.block_policies:  # else the strategy's own policy (plan_strategy)
            from memclaims.techniques.impl import block_checkpointing as checkpointing

            engine.notes.append(checkpointing.enable(model, engine.recipe.workload))
        return model

    def plan_strategy(self, plan: StrategyPlan) -> StrategyPlan:
        return replace(plan, checkpoint_blocks=True)

    def removes(self, after: Record) -> Removal | None:
        return Removal(rest=0.0, why="checkpointing removes every activation", phase="forward")

    def compare_without(self) -> bool:
        return True

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        if record.recomputed_linear_calls == 0:  # None: an engine that does not observe it (FSDP on the sim)
            say("no nn.Linear ran inside the first backward pass: nothing was recomputed")
        forward_keeps_less(record, without, say)

    def sim_after_load(self, model: nn.Module, recipe: Recipe, notes: list[str]) -> None:
        from memclaims.techniques.impl import block_checkpointing as checkpointing

        notes.append(checkpointing.enable(model, recipe.workload))  # as the real engine's (wrapping allocates nothing)


# Needs no sharding: on one device each block is wrapped in torch.utils.checkpoint (hf: and
# text models through their own gradient_checkpointing_enable()); with fsdp, Lightning's policy.
ENTRY = Technique("activation-checkpointing", "recompute each transformer block's activations in backward",
                  "08_fsdp-with-01-2", hooks=ActivationCheckpointing(),
                  # TrainingArguments(gradient_checkpointing=True) checkpoints every block, as this does;
                  # "checkpointing" alone is selective-checkpointing's too, so it is refused as ambiguous.
                  aliases=("gradient_checkpointing", "gradient-checkpointing", "checkpointing"))
