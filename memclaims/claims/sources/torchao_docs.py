"""torchao's documentation (``memclaims/resources/sources/torchao-docs.json``): its low-bit optimizers' state bytes
and peaks, on what each observed (its ``by_technique`` part)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from memclaims.claims.check import Check, Verdict
from memclaims.claims.lookup import Lookup, Techniques
from memclaims.core.record import Record

DOCUMENT = "torchao-docs"

AO_ADAMW: Techniques = ("adamw",)
AO_LOW_BIT: tuple[Techniques, ...] = (("ao-adamw8bit",), ("ao-adamw4bit",), ("ao-adamw-fp8",))
# torchao's README: 8-bit and FP8 states at one byte an element, 4-bit at half a byte, "block size is 256 for 8-bit
# and FP8 optimizers, and 128 for 4-bit optimizers", one float32 scale per block: each quantized state's bytes
# per element against AdamW's float32 4 (bits / 8 + 4 / block) / 4: 0.2539, 0.1328, 0.2539.
AO_BITS_AND_BLOCK = {"ao-adamw8bit": (8, 256), "ao-adamw4bit": (4, 128), "ao-adamw-fp8": (8, 256)}
# The README's ViT-H table (peak allocated, GB): PyTorch's fused AdamW 12.23, ao 8-bit 8.33, ao FP8 8.33, ao 4-bit
# 7.72: the peak falls by 3.90 and 4.51 GB, 1.04 and 1.03 times the states the 630M parameters save (5.97 and
# 6.94 B each). Asserted: the peak falls by 0.9 to 1.1 times the state bytes the recipe saves (measured: 1.000 at
# vit-smoke on the cpu tier, 0.99 at ViT-L/16 on the sim), FP8's peak within 0.1 % of 8-bit's less the 8-bit
# quantization maps FP8 has none of (a 1 KiB map per state tensor: 0.8 % of vit-smoke's peak, 0.001 % of
# ViT-L/16's), 4-bit's below.
AO_PEAK_SHARE = (0.9, 1.1)
AO_FP8_AS_8BIT = 0.001


def _ao_state(record: Record, name: str) -> Callable[..., Any]:
    """What torchao's optimizer ``name`` observed of its states, by key (``Record.observed``)."""
    return partial(record.observed, name)


def _low_bit_states(tier: str, get: Lookup) -> Verdict:
    """Each of torchao's three holds, for the parameters it quantizes, bits / 8 bytes of codes an element and one
    float32 scale per block, and AdamW's float32 states for the rest: its state is AdamW's with the quantized
    parameters' states at (bits / 8 + 4 / block) / 4 of their float32 bytes, plus the quantization maps."""
    adamw = get(AO_ADAMW)
    parts, holds = [], True
    for key in AO_LOW_BIT:
        name = key[0]
        record, (bits, block) = get(key), AO_BITS_AND_BLOCK[name]
        seen = _ao_state(record, name)
        quantized: dict[str, Any] = next(iter(seen("state_subclasses", {}).values()), {})
        elements = int(quantized.get("elements", 0))
        codes_and_scales = int(quantized.get("codes_bytes", 0)) + int(quantized.get("scale_bytes", 0))
        expected = (bits / 8 + 4 / block) / 4
        share = codes_and_scales / (4 * elements) if elements else float("nan")
        plain, steps, maps = (int(seen("plain_states", {}).get("bytes", 0)), int(seen("step_bytes", 0)),
                              int(quantized.get("qmap_bytes", 0)))
        as_adamw = plain + 4 * elements + steps  # the same parameters' AdamW states, float32
        whole = codes_and_scales + maps + plain + steps
        ok = (elements > 0 and abs(share - expected) <= 1e-9 and as_adamw == adamw.optimizer_state_bytes
              and whole == record.optimizer_state_bytes)
        holds = holds and ok
        parts.append(f"{name}: {elements:,} state elements quantized at {share:.4f} of float32 (published bits "
                     f"{bits}, block {block}: {expected:.4f}), state {record.optimizer_state_bytes:,} B = codes and "
                     f"scales {codes_and_scales:,} B + maps {maps:,} B + plain {plain:,} B + steps {steps:,} B; as "
                     f"AdamW's {as_adamw:,} B (AdamW's measured: {adamw.optimizer_state_bytes:,} B)")
    return Verdict(holds, "; ".join(parts))


def _low_bit_peaks(tier: str, get: Lookup) -> Verdict:
    adamw = get(AO_ADAMW)
    records = {key[0]: get(key) for key in AO_LOW_BIT}
    low, high = AO_PEAK_SHARE
    parts, holds = [], True
    for name, record in records.items():
        fall = adamw.peak_allocated_bytes - record.peak_allocated_bytes
        saved = adamw.optimizer_state_bytes - record.optimizer_state_bytes
        share = fall / saved if saved > 0 else float("nan")
        holds = holds and saved > 0 and low <= share <= high
        parts.append(f"{name}: peak {record.peak_allocated_bytes:,} B, {fall:,} B below AdamW's "
                     f"{adamw.peak_allocated_bytes:,} B for {saved:,} B of state saved ({share:.3f}, band "
                     f"[{low:g}, {high:g}])")
    eight, four, fp8 = (records[n].peak_allocated_bytes for n in ("ao-adamw8bit", "ao-adamw4bit", "ao-adamw-fp8"))
    maps = sum(int(held.get("qmap_bytes", 0)) for held in
               _ao_state(records["ao-adamw8bit"], "ao-adamw8bit")("state_subclasses", {}).values())
    same = abs(fp8 - (eight - maps)) <= AO_FP8_AS_8BIT * eight
    return Verdict(holds and same and four < eight,
                   "; ".join(parts) + f"; FP8's peak {'within' if same else 'not within'} {AO_FP8_AS_8BIT:.1%} of "
                   f"8-bit's less its {maps:,} B of quantization maps, 4-bit's {'below' if four < eight else 'not below'} "
                   "8-bit's (published: 8.33, 8.33, 7.72 GB against 12.23)")


CHECKS: dict[str, Check] = {
    "torchao-low-bit-state-bytes": Check(_low_bit_states, frozenset({"cpu", "sim"}), {"*": (AO_ADAMW, *AO_LOW_BIT)}),
    "torchao-low-bit-peak-falls-by-state": Check(_low_bit_peaks, frozenset({"cpu", "sim"}),
                                                 {"*": (AO_ADAMW, *AO_LOW_BIT)}),
}
