"""qlora-no-double-quant: the qlora technique's NF4 base without double quantization, each block's absmax kept in
fp32 (bitsandbytes' ``compress_statistics=False``; transformers' ``BitsAndBytesConfig`` default,
``bnb_4bit_use_double_quant=False``).

Why the option turns double quantization off rather than on: ``qlora`` has run bitsandbytes' own default from the
start (``Params4bit(compress_statistics=True)``, the QLoRA paper's recipe and peft's QLoRA example), so its Records
hold double-quantized bases; an option that switched it on would leave them meaning the same while the plain name
read as without. The qlora module reads this entry's name to choose (``memclaims.techniques.qlora``); this
module's own hooks check what ran: every 4-bit layer's absmax in fp32, none nested, and the GEMMs given no 8-bit
absmax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.techniques.base import Hooks, Say, Technique

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

NAME = "qlora-no-double-quant"
QLORA = "qlora"  # whose Record part shows how the base was quantized


class NoDoubleQuant(Hooks):
    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        if record.observed(QLORA, "double_quant") != [False] or record.observed(QLORA, "absmax_dtype") != ["float32"]:
            say(f"by_technique.qlora.double_quant is {record.observed(QLORA, 'double_quant')}, absmax_dtype "
                f"{record.observed(QLORA, 'absmax_dtype')} after phase load: the absmax was not kept in fp32 (compress_statistics "
                "was not turned off)")
        if record.observed(QLORA, "gemm_absmax_8bit") not in ([False], None):
            say(f"by_technique.qlora.gemm_absmax_8bit is {record.observed(QLORA, 'gemm_absmax_8bit')} in the first phase "
                "forward: the 4-bit GEMMs were given an 8-bit absmax")


ENTRY = Technique(NAME, "qlora without double quantization: each 64-weight block's absmax in fp32 (0.5 bits per "
                  "parameter; bitsandbytes' compress_statistics=False)",
                  "QLoRA paper, section 3 (double quantization); transformers BitsAndBytesConfig",
                  needs=frozenset({"qlora"}), in_cover=False, in_default=False, requires=frozenset({"bitsandbytes"}),
                  hooks=NoDoubleQuant())
