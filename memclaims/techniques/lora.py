"""lora: peft's LoRA adapters (issue #27): base weights frozen, rank-8 adapters on the workload's attention
projections, its classification head trained (``modules_to_save``).

``peft.get_peft_model`` runs right after the model is built (``memclaims.techniques.impl.peft_adapters``; on the sim's fake
tensors ``memclaims.techniques.impl.peft_adapters_fake``), before the optimizer sees the parameters. What shows it: the
trainable share of the parameters and an optimizer state only the trainable ones can hold (``trainable_parameters``
and ``total_parameters`` in the technique's part of the Record, ``by_technique["lora"]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import Hooks, Say, Technique, observations
from memclaims.techniques.shared_conflicts import STRATEGIES

if TYPE_CHECKING:
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.workloads.types import Workload

NAME = "lora"  # the technique's registry name, and its part of the Record (``by_technique``)

# At most this fraction of the parameters trainable (rank-8 adapters on two projections per layer and the
# head: 5.6 % of the 2-layer, 64-wide smoke DistilBERT, whose head is a large share of it; 1.1 % of the
# article one; everything trainable, when the base weights were not frozen, is 100 %), and per trainable
# parameter at most Adam's two moments in fp32, plus one 8-byte step count per parameter tensor.
LORA_MAX_TRAINABLE = 0.10
LORA_STATE_BYTES_PER_TRAINABLE = 8
LORA_STEP_BYTES_PER_TENSOR = 8


class Lora(Hooks):
    convert_order = 2  # after the fused loss's head bypass: the adapters go on the model the loss trains

    def convert_module(self, model: nn.Module, engine: Any) -> nn.Module:
        from memclaims.techniques.impl import peft_adapters as lora

        return lora.apply(model, engine.recipe.workload)  # frozen base, adapters and head trainable

    def reference_module(self, model: nn.Module, workload: Workload) -> nn.Module:
        from memclaims.techniques.impl import peft_adapters as lora

        return lora.apply(model, workload)

    def observe(self, engine: Any, model: nn.Module, optimizer: Any, probe: Any) -> dict[str, Any]:
        from memclaims.techniques.impl import peft_adapters as lora

        return self.adapted(lora.parameter_fields(model))

    def adapted(self, counts: dict[str, Any]) -> dict[str, Any]:
        """The adapted model's counts (``peft_adapters.parameter_fields``) as the Record's parts: lora's parameter
        elements that require a gradient (the adapters and the trained head) and all of them (frozen base weights
        included), counted on the model as the load phase left it."""
        return observations(NAME, trainable_parameters=counts["trainable_parameters"],
                            total_parameters=counts["total_parameters"])

    def expected_grad_bytes(self, record: Record, bytes_per_param: int, expected: int) -> int:
        # Gradients for the trainable parameters only: the frozen base weights get none.
        trainable = record.observed(NAME, "trainable_parameters")
        return trainable * bytes_per_param if trainable is not None else expected

    def accuracy_reported_only(self, record: Record) -> bool:
        # Adapters on a frozen, randomly initialised base (no cached pretrained weights) barely move it
        # (smoke DistilBERT: 0.50 after 3 epochs); the lora case is about memory.
        return record.weights == "random"

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        trainable, total = record.observed(NAME, "trainable_parameters"), record.observed(NAME, "total_parameters")
        if trainable is None or not total:
            say(f"trainable_parameters is {trainable}, total_parameters {total} after phase load: the run saw no "
                "adapted model")
            return
        if trainable / total >= LORA_MAX_TRAINABLE:
            say(f"trainable_parameters is {trainable:,} of {total:,} ({trainable / total:.1%}) after phase load, "
                f"not below {LORA_MAX_TRAINABLE:.0%}: the base weights were not frozen")
        bound = LORA_STATE_BYTES_PER_TRAINABLE * trainable + LORA_STEP_BYTES_PER_TENSOR * record.param_tensor_count
        if record.optimizer_state_bytes > bound:
            say(f"optimizer_state_bytes is {record.optimizer_state_bytes:,} B after phase optimizer_step, above "
                f"the {bound:,} B that {trainable:,} trainable parameters can hold: the optimizer kept state for "
                "frozen base weights")

    def sim_adapt(self, model: nn.Module, recipe: Recipe, move: Callable[[nn.Module, Any], None]) -> nn.Module:
        from memclaims.techniques.impl.peft_adapters_fake import apply

        return apply(model, recipe.workload, lambda module, dtype: move(module, dtype))

    def sim_observe(self, model: nn.Module, optimizer: Any, session: Any) -> dict[str, Any]:
        from memclaims.techniques.impl.peft_adapters import parameter_fields

        return self.adapted(parameter_fields(model))


# memclaims' own: the adapters are put on the model in the one-device load (memclaims.measure.pipeline,
# memclaims.sim.replay); the ranks' engines build theirs without them.
_RANKS_DO_NOT_ADAPT = "memclaims applies the LoRA adapters in the one-device engines only; the multi-rank engines build the model without them"
CONFLICTS: tuple[tuple[str, str], ...] = (
    *((s, _RANKS_DO_NOT_ADAPT) for s in STRATEGIES),
    ("optimizer-in-backward", "memclaims' in-backward step counts one step per parameter per backward; the frozen "
                              "base weights get no gradient, so their post-accumulate hooks never fire"),
)
WORKLOADS = ("lora_targets", "peft's LoRA adapters go on the attention projections of the text workloads "
             "(distilbert, distilbert-cased, bigbird: q_lin/v_lin, query/value) and of hf: models (peft's "
             "default target modules for their model type); this workload names no modules to adapt")

# peft.get_peft_model(model, LoraConfig(r=8, lora_alpha=16, ...)) right after the model is built: the base
# weights frozen, rank-8 adapters on the workload's attention projections, its head trained (modules_to_save).
ENTRY = Technique(NAME, "peft LoRA: base weights frozen, rank-8 adapters on the attention's query and value "
                  "projections, the classification head trained", "peft docs: LoRA", group="adapter",
                  in_cover=False, conflicts=CONFLICTS, workload_needs=WORKLOADS, hooks=Lora())
