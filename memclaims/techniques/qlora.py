"""qlora: the lora technique's adapters over a base whose linear layers are stored in bitsandbytes 4-bit NF4
(fp32 compute), frozen (peft docs: QLoRA). Each ``nn.Linear`` of the base (not the head) is replaced by
``Linear4bit`` before the adapters go on (``memclaims.techniques.impl.peft_adapters.quantize``); the sim refuses it
(bitsandbytes quantizes from the weights' values). What shows it, beyond lora's: the Record's
``quantized_parameter_bytes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memclaims.techniques import lora
from memclaims.techniques.base import TRUE_HALF_PRECISIONS, Say, Technique

if TYPE_CHECKING:
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe


class Qlora(lora.Lora):
    def convert_module(self, model: nn.Module, engine: Any) -> nn.Module:
        from memclaims.techniques.impl import peft_adapters as adapters

        # The base's linear layers in 4 bits, before the adapters go on.
        model = adapters.quantize(model, engine.recipe.workload, engine.options.device)
        return super().convert_module(model, engine)

    def sim_refusal(self, recipe: Recipe) -> str | None:
        return ("qlora's 4-bit base is quantized by bitsandbytes from the weights' values (NF4, a block-wise "
                "absmax), which fake tensors do not have; run it on --device cpu or cuda")

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        super().check(recipe, record, without, say)
        if not record.quantized_parameter_bytes:
            say(f"quantized_parameter_bytes is {record.quantized_parameter_bytes} after phase load: no base weight "
                "was stored in 4 bits (bitsandbytes' Linear4bit)")


# memclaims' own: it quantizes the base once, in fp32 compute, from the weights as built on the host.
_CONFLICTS: tuple[tuple[str, str], ...] = (
    *((half, "Fabric's true-precision setup converts every floating parameter to the half dtype; memclaims "
             "quantizes the base in fp32 compute and does not set Linear4bit's compute dtype from the recipe")
      for half in TRUE_HALF_PRECISIONS),
    ("init-module", "memclaims quantizes the base from the fp32 weights as built; init_module would build them "
                    "on the device in the recipe's dtype first, which it does not replay"),
)

ENTRY = Technique("qlora", "QLoRA: the base's linear layers in bitsandbytes 4-bit NF4 (fp32 compute), frozen, under "
                  "the lora technique's adapters", "peft docs: QLoRA (bitsandbytes 4-bit)", group="adapter",
                  in_cover=False, requires=frozenset({"bitsandbytes"}), conflicts=lora.CONFLICTS + _CONFLICTS,
                  workload_needs=lora.WORKLOADS, hooks=Qlora())
