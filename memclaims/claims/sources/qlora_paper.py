"""The QLoRA paper (``memclaims/resources/sources/qlora-paper.json``): NF4 storage and double quantization's
saving, on what the qlora technique observed (its ``by_technique`` part)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from memclaims.claims.check import Check, Verdict
from memclaims.claims.lookup import Lookup, Techniques
from memclaims.core.record import Record

DOCUMENT = "qlora-paper"

QLORA: Techniques = ("qlora",)
QLORA_NO_DOUBLE_QUANT: Techniques = ("qlora", "qlora-no-double-quant")
# The QLoRA paper's storage arithmetic, section 3: NF4 weights in 4 bits; fp32 constants, one per block of 64
# (32/64 = 0.5 bits a weight); double quantization keeps them in 8 bits with an fp32 constant per 256 of them.
NF4_BITS = 4
ABSMAX_BITS = 32 / 64
DOUBLE_QUANT_BITS = 8 / 64 + 32 / (64 * 256)  # 0.127 in the paper
DOUBLE_QUANT_SAVING = ABSMAX_BITS - DOUBLE_QUANT_BITS  # 0.373046875; "0.373" in the paper


def _four_bit(record: Record) -> Callable[..., Any]:
    """What the Record says the 4-bit layers store, by key (the qlora technique's observation, ``Record.observed``)."""
    return partial(record.observed, "qlora")


def _nf4_storage(tier: str, get: Lookup) -> Verdict:
    seen = _four_bit(get(QLORA_NO_DOUBLE_QUANT))
    weights = seen("quantized_elements") or 0
    packed = 8 * seen("packed_bytes", 0) / weights if weights else float("nan")
    absmax = 8 * seen("absmax_bytes", 0) / weights if weights else float("nan")
    return Verdict(weights > 0 and packed == NF4_BITS and absmax == ABSMAX_BITS and seen("absmax_dtype") == ["float32"],
                   f"{weights:,} weights in {seen('layers', 0)} 4-bit layers: {packed:g} bits each packed in "
                   f"{seen('packed_dtype')} and {absmax:g} bits of {seen('absmax_dtype')} absmax (paper: "
                   f"{NF4_BITS} + {ABSMAX_BITS:g}); NF4 code tables {seen('code_bytes', 0):,} B beside them")


def _double_quant_saving(tier: str, get: Lookup) -> Verdict:
    plain, double = _four_bit(get(QLORA_NO_DOUBLE_QUANT)), _four_bit(get(QLORA))
    weights, layers = plain("quantized_elements") or 0, double("layers", 0)
    if not weights or weights != double("quantized_elements"):
        return Verdict(False, f"no 4-bit weights to compare: {weights} without double quantization, "
                              f"{double('quantized_elements')} with it")
    before = 8 * plain("absmax_bytes") / weights
    after = 8 * (double("absmax_bytes") + double("nested_absmax_bytes")) / weights
    saving = before - after
    # bitsandbytes quantizes each layer's absmax in its own blocks of 256: the last one rounded up, at most 32
    # bits more a layer than the paper's arithmetic over one whole tensor.
    low = DOUBLE_QUANT_SAVING - 32 * layers / weights
    return Verdict(low - 1e-12 <= saving <= DOUBLE_QUANT_SAVING + 1e-12 and double("double_quant") == [True],
                   f"absmax {before:.4f} -> {after:.4f} bits a weight over {weights:,} weights in {layers} layers: "
                   f"{saving:.4f} saved (paper 0.373, exactly {DOUBLE_QUANT_SAVING:.5f}; at least {low:.4f} with each "
                   f"layer's last block of 256 rounded up); the second level's code tables and offsets, "
                   f"{double('nested_code_bytes') + double('offset_bytes'):,} B, beside the paper's arithmetic")


CHECKS: dict[str, Check] = {
    "qlora-nf4-storage": Check(_nf4_storage, frozenset({"cpu", "sim"}), {"*": (QLORA_NO_DOUBLE_QUANT,)},
                               workload="distilbert"),
    "qlora-double-quant-saving": Check(_double_quant_saving, frozenset({"cpu", "sim"}),
                                       {"*": (QLORA_NO_DOUBLE_QUANT, QLORA)}, workload="distilbert"),
}
