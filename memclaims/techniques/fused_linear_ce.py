"""fused-linear-ce: the causal LM's vocabulary projection and cross-entropy fused and chunked over the tokens
(``torch.nn.functional.linear_cross_entropy`` with ``LinearCrossEntropyOptions``): the (tokens x vocabulary)
logits are never materialized whole.

In the load phase the head is bypassed (the model returns its hidden states; ``memclaims.techniques.impl.chunked_linear_ce``)
before any adapters go on; the loop's loss then takes the head's weight (in eval mode the head computes
logits as before). On the sim ``memclaims.techniques.impl.chunked_linear_ce_fake`` allocates the op's chunk as CUDA sizes it.
What shows it: the op's calls, chunk and fallbacks (the Record's ``fused_loss_*`` fields).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import STRATEGIES, Hooks, Say, Technique

if TYPE_CHECKING:
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe


def _head(recipe: Recipe) -> Callable[[nn.Module], nn.Module]:
    head = recipe.workload.fused_loss_head
    assert head is not None, "recipe.resolve refuses fused-linear-ce on a workload without a vocabulary projection"
    return head


class FusedLinearCrossEntropy(Hooks):
    def attach(self, engine: Any) -> None:
        from memclaims.core.precision import PRECISIONS
        from memclaims.techniques.impl.chunked_linear_ce import FusedLoss

        engine.helpers.append(FusedLoss(PRECISIONS[engine.precision_ran].compute_dtype))  # under what Lightning ran

    def convert_module(self, model: nn.Module, engine: Any) -> nn.Module:
        from memclaims.techniques.impl import chunked_linear_ce as fused_loss

        return fused_loss.apply(model, _head(engine.recipe))  # the head bypassed in training

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """The chunked op ran for every micro-batch, on its chunked path, in chunks smaller than the tokens
        (one chunk of all of them would be the reference's logits buffer again)."""
        calls, rows, chunk = record.fused_loss_calls, record.fused_loss_rows, record.fused_loss_chunk_rows
        micro_batches = (record.step_micro_batches or 1) * record.memory_steps
        if not calls or calls < micro_batches:
            say(f"fused_loss_calls is {calls} after phase train for {micro_batches} micro-batches: the loss was "
                "computed from materialized logits (F.cross_entropy), not by linear_cross_entropy")
        elif record.fused_loss_fallbacks:
            say(f"fused_loss_fallbacks is {record.fused_loss_fallbacks} after phase train: linear_cross_entropy "
                "ignored its options and ran the reference path, logits whole")
        elif rows is None or chunk is None or chunk >= rows:
            say(f"fused_loss_chunk_rows is {chunk} for {rows} tokens after phase train: one chunk of every token "
                "materializes the whole logits")

    def sim_attach(self, loop: Any, session: Any) -> None:
        from memclaims.techniques.impl.chunked_linear_ce_fake import SimulatedFusedLoss

        loop.helpers.append(SimulatedFusedLoss(loop.precision.compute))

    def sim_adapt(self, model: nn.Module, recipe: Recipe, move: Callable[[nn.Module, Any], None]) -> nn.Module:
        if recipe.workload.fused_loss_head is None:
            return model
        from memclaims.techniques.impl.chunked_linear_ce import apply

        return apply(model, recipe.workload.fused_loss_head)


# The strategies shard or wrap the vocabulary projection; memclaims' fused loss reads its weight outside the
# model's forward, which FSDP frees (resharded) and the ranks' engines compute the loss from logits.
_CONFLICTS: tuple[tuple[str, str], ...] = tuple(
    (s, "memclaims computes the fused loss in the one-device engines only: it reads the vocabulary projection's "
        "weight after the forward, which FSDP has resharded, and the multi-rank engines compute the loss from "
        "logits") for s in STRATEGIES)
_WORKLOADS = ("fused_loss_head", "the fused linear + cross-entropy replaces a causal LM's vocabulary projection and "
              "its loss (hf: workloads with the causal-lm head whose logits are the plain projection, without "
              "soft-capping or scaling); this workload has none")

ENTRY = Technique("fused-linear-ce", "the causal LM's vocabulary projection and cross-entropy fused and chunked over "
                  "the tokens (torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions): the logits "
                  "are never materialized whole", "torch docs: linear_cross_entropy", in_cover=False,
                  requires=frozenset({"linear_cross_entropy"}), conflicts=_CONFLICTS, workload_needs=_WORKLOADS,
                  hooks=FusedLinearCrossEntropy())
