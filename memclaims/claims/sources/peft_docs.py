"""peft's documentation (``memclaims/resources/sources/peft-docs.json``): LoRA's few trainable parameters."""

from __future__ import annotations

from memclaims.claims.check import Check, Verdict
from memclaims.claims.figures import in_mib
from memclaims.claims.lookup import Lookup, Techniques

DOCUMENT = "peft-docs"

LORA: Techniques = ("lora",)
# peft's README: "only fine-tune a small number of (extra) model parameters, thereby greatly decreasing the
# computational and storage costs". Asserted on DistilBERT: at most this share of the parameters trainable
# and at most this share of the optimizer state of the same recipe without adapters (measured: 5.6 % and
# 5.95 % on the 2-layer, 64-wide smoke model on the cpu tier, whose 2-label head is a large share of it;
# 1.09 % and 1.10 % at article scale on the sim).
LORA_SHARE = 0.10


def _lora_state(tier: str, get: Lookup) -> Verdict:
    plain, adapted = get(("fabric",)), get(LORA)
    trainable, total = (adapted.observed(LORA[0], key) or 0 for key in ("trainable_parameters", "total_parameters"))
    fraction = trainable / total if total else float("nan")
    state = adapted.optimizer_state_bytes / plain.optimizer_state_bytes if plain.optimizer_state_bytes else float("nan")
    return Verdict(total > 0 and fraction <= LORA_SHARE and state <= LORA_SHARE,
                   f"trainable {trainable:,} of {total:,} parameters ({fraction:.2%}); optimizer state "
                   f"{in_mib(plain.optimizer_state_bytes)} -> {in_mib(adapted.optimizer_state_bytes)} with the adapters "
                   f"({state:.2%} of it; both at most {LORA_SHARE:.0%})")


CHECKS: dict[str, Check] = {
    "lora-few-trainable-parameters": Check(_lora_state, frozenset({"cpu", "sim"}), {"*": (("fabric",), LORA)},
                                           workload="distilbert"),
}
