"""qlora: the lora technique's adapters over a base whose linear layers are stored in bitsandbytes 4-bit NF4, as
QLoRA is run (peft docs: QLoRA; the QLoRA paper): each ``nn.Linear`` of the base but the head and the output
embeddings is replaced by ``Linear4bit`` before the adapters go on (``memclaims.techniques.impl.nf4_base``),
quantized from the weights in the recipe's parameter dtype, computing in the recipe's compute dtype (bf16 under
bf16-true and bf16-mixed, fp32 under 32-true), with double quantization (bitsandbytes' default; ``-t
qlora-no-double-quant`` keeps the absmax in fp32). The rest of the model stays in the recipe's precision.

On the sim the same layers are built on fake tensors from shapes alone: the packed weights, the absmax and the
code tables, each layer quantized on the device as it moves there (``sim_before_move``), bitsandbytes' own
forward and backward, and the scratch of the forward's ``gemm_4bit`` (the weight dequantized into the compute
dtype), which the dispatch cannot see inside the custom op.

What shows it, beyond lora's: ``by_technique["qlora"]`` (``quantized_parameter_bytes``, the storage of the 4-bit
layers, the dtypes they were quantized from and compute in, and what the first forward's 4-bit GEMMs ran with: their
input dtype and whether the absmax came in 8 bits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.techniques import lora
from memclaims.techniques import qlora_no_double_quant as no_double_quant
from memclaims.techniques.base import Observed, Say, Technique, merge_observed, observations

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimLoop, SimSession

NAME = "qlora"


def double_quant(recipe: Recipe) -> bool:
    """Whether the recipe's 4-bit base is double-quantized (bitsandbytes' ``compress_statistics``)."""
    return no_double_quant.NAME not in recipe.techniques


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


class Qlora(lora.Lora):
    name = NAME  # its parameters are lora's (``lora.LoraParameters``), asked of qlora: ``qlora[r=4]``

    def attach(self, engine: RealRun) -> None:
        from memclaims.techniques.impl import nf4_base as nf4

        engine.helpers.append(nf4.FourBitCompute(nf4.GemmSeen(), dispatch=True))

    def convert_module(self, model: nn.Module, engine: RealRun) -> nn.Module:
        from memclaims.core.precision import PRECISIONS
        from memclaims.techniques.impl import nf4_base as nf4

        ran = PRECISIONS[engine.precision_ran]  # on the CPU Lightning runs 16-mixed as bf16-mixed
        # The base's linear layers in 4 bits, before the adapters go on.
        model = nf4.quantize(model, engine.recipe.workload, engine.options.device, compute_dtype=ran.compute_dtype,
                             weight_dtype=ran.param_dtype, double_quant=double_quant(engine.recipe))
        model = super().convert_module(model, engine)
        if ran.mixed:  # peft put the adapters in the 4-bit layers' compute dtype; trained in the parameters'
            from peft.tuners.tuners_utils import cast_adapter_dtype

            cast_adapter_dtype(model, adapter_name="default", autocast_adapter_dtype=True)
        return model

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        from memclaims.techniques.impl import nf4_base as nf4

        seen = next(h for h in engine.helpers if isinstance(h, nf4.FourBitCompute)).seen
        observed = super().observe(engine, model, optimizer, probe)
        merge_observed(observed, observations(NAME, **nf4.storage(model), **seen.fields()))
        return observed

    def adapted(self, counts: dict[str, object]) -> Observed:
        """lora's parts, and qlora's ``quantized_parameter_bytes``: the bytes of the parameters stored quantized
        (bitsandbytes' 4-bit weights, packed in uint8)."""
        observed = super().adapted(counts)
        merge_observed(observed, observations(NAME, quantized_parameter_bytes=counts["quantized_parameter_bytes"]))
        return observed

    def expected_param_bytes(self, record: Record, bytes_per_param: int, expected: int) -> int:
        # A packed 4-bit weight is one stored uint8 element a byte (param_count counts its bytes), and bitsandbytes'
        # forward casts each 4-bit layer's bias to the compute dtype in place; the rest in the precision's dtype.
        if not record.by_technique.get(NAME):  # no 4-bit layer observed
            return expected
        packed = record.observed(NAME, "quantized_parameter_bytes") or 0
        bias_elements, bias_bytes = record.observed(NAME, "bias_elements"), record.observed(NAME, "bias_bytes")
        return int(expected - (packed + bias_elements) * bytes_per_param + packed + bias_bytes)

    def judges_parameter_bytes(self, record: Record) -> bool:
        """4-bit base weights among the precision's (``JudgesParameterBytes``): ``check`` counts them."""
        return bool(record.observed(NAME, "quantized_parameter_bytes"))

    def stored_bits(self) -> int:
        return 4

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        from memclaims.core.precision import PRECISIONS

        super().check(recipe, record, without, say)
        packed = record.observed(NAME, "quantized_parameter_bytes")
        if not packed:
            say(f"quantized_parameter_bytes is {packed} after phase load: no base weight "
                "was stored in 4 bits (bitsandbytes' Linear4bit)")
        seen = record.by_technique.get(NAME)
        if not seen or "packed_dtype" not in seen:
            say("by_technique.qlora is missing: the run observed no 4-bit layer")
            return
        if seen["packed_dtype"] != ["uint8"] or 2 * seen["packed_bytes"] != seen["quantized_elements"]:
            say(f"by_technique.qlora.packed_bytes is {seen['packed_bytes']:,} B in {seen['packed_dtype']} for "
                f"{seen['quantized_elements']:,} weights after phase load: not 4 bits a weight")
        ran = PRECISIONS[record.precision]  # what ran (the cpu tier's bf16-mixed for 16-mixed)
        compute, stored = _dtype_name(ran.compute_dtype), _dtype_name(ran.param_dtype)
        rest = record.param_count - seen["packed_bytes"] - seen["bias_elements"]
        if record.device != "sim" or record.param_bytes:
            floating = record.param_bytes - seen["packed_bytes"] - seen["bias_bytes"]
            if floating != rest * ran.param_dtype.itemsize:
                say(f"param_bytes less the 4-bit layers' {seen['packed_bytes'] + seen['bias_bytes']:,} B is "
                    f"{floating:,} B after phase load, not {rest:,} parameters in {stored}: the rest of the model is "
                    "not in the recipe's precision")
        if seen["gemm_dtypes"] != [compute]:
            say(f"by_technique.qlora.gemm_dtypes is {seen['gemm_dtypes']} in the first phase forward: the 4-bit "
                f"layers did not compute in the recipe's {compute} (Linear4bit's compute_dtype)")
        if seen["quantized_from"] != [stored]:
            say(f"by_technique.qlora.quantized_from is {seen['quantized_from']} after phase load: the base was not "
                f"quantized from the recipe's {stored} weights")
        if double_quant(recipe) and (seen["double_quant"] != [True] or seen["gemm_absmax_8bit"] != [True]):
            say(f"by_technique.qlora.double_quant is {seen['double_quant']} after phase load, gemm_absmax_8bit "
                f"{seen['gemm_absmax_8bit']} in the first phase forward: the absmax was not double-quantized "
                "(compress_statistics ignored)")

    def sim_adapt(self, model: nn.Module, recipe: Recipe, move: Callable[[nn.Module, torch.dtype | None], None]) -> nn.Module:
        from memclaims.core.precision import PRECISIONS
        from memclaims.techniques.impl import nf4_base as nf4

        spec = PRECISIONS[recipe.precision]
        model = nf4.quantize_fake(model, recipe.workload, compute_dtype=spec.compute_dtype,
                                  double_quant=double_quant(recipe))
        model = super().sim_adapt(model, recipe, move)
        if spec.mixed:  # peft's cast_adapter_dtype, replayed as the sim converts (a new storage per tensor)
            nf4.upcast_adapters(model, spec.param_dtype, move)
        return model

    def sim_before_move(self, model: nn.Module, recipe: Recipe) -> None:
        from memclaims.techniques.impl import nf4_base as nf4

        nf4.place_on_device(model)

    def sim_attach(self, loop: SimLoop, session: SimSession) -> None:
        from memclaims.techniques.impl import nf4_base as nf4

        # The CPU's default gemm_4bit kernel under the cpu-kernels profile, CUDA's everywhere else.
        scratch = nf4.GemmScratch("cpu" if "CPU kernels" in session.profile.gpu else "cuda")
        session.memory.op_scratch[nf4.gemm_op()] = scratch
        loop.helpers.append(nf4.FourBitCompute(scratch, dispatch=False))

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        from memclaims.techniques.impl import nf4_base as nf4

        scratch = session.memory.op_scratch[nf4.gemm_op()]
        assert isinstance(scratch, nf4.GemmScratch), "sim_attach put the 4-bit GEMM's scratch model there"
        observed = super().sim_observe(model, optimizer, session)
        merge_observed(observed, observations(NAME, **nf4.storage(model), **scratch.fields()))
        return observed


# memclaims' own: it quantizes the base as it is built on the host, layer by layer as each moves to the device
# (as transformers' loader does, weight by weight); init_module builds the whole base on the device first.
_CONFLICTS: tuple[tuple[str, str], ...] = (
    ("init-module", "memclaims quantizes each base layer as it moves from the host to the device (as transformers' "
                    "loader quantizes weight by weight); init_module would build the whole base on the device in "
                    "full precision first, a load no QLoRA recipe runs"),
)

ENTRY = Technique(NAME, "QLoRA: the base's linear layers in bitsandbytes 4-bit NF4 with double quantization, "
                  "computing in the recipe's compute dtype, frozen, under the lora technique's adapters",
                  "peft docs: QLoRA (bitsandbytes 4-bit); the QLoRA paper", group="adapter",
                  in_cover=False, requires=frozenset({"bitsandbytes"}), conflicts=lora.CONFLICTS + _CONFLICTS,
                  workload_needs=lora.WORKLOADS, parameters=lora.LoraParameters, hooks=Qlora())
