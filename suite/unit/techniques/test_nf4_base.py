"""memclaims.techniques.impl.nf4_base: the qlora technique's 4-bit layers on real and fake tensors.

The fake layer stores what bitsandbytes' real one stores, tensor for tensor; the scratch the sim adds for the
forward's gemm_4bit is what bitsandbytes' CPU kernel allocates inside the custom op before its output (read with
torch's profiler, the one view inside a custom op: a dispatch mode, the cpu tier's probe included, sees only the
op); the fake quantization leaves bitsandbytes' global code cache as it found it; and the layers a base quantizes
are not its trained head or its output embeddings.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memclaims.recipes.recipe import resolve
from memclaims.techniques.impl import nf4_base as nf4

pytestmark = [pytest.mark.cpu, pytest.mark.requires(bitsandbytes="cpu")]


class _Targets:
    modules_to_save: tuple[str, ...] = ()


class _Workload:
    lora_targets = _Targets()


def _real(shape: tuple[int, int], dtype: torch.dtype, double_quant: bool, compute: torch.dtype) -> nn.Module:
    model = nn.Sequential(nn.Linear(shape[1], shape[0]).to(dtype))
    return nf4.quantize(model, _Workload(), "cpu", compute_dtype=compute, weight_dtype=dtype,  # type: ignore[arg-type]
                        double_quant=double_quant)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("double_quant", [True, False], ids=["double-quant", "fp32-absmax"])
def test_the_fake_layer_stores_what_the_real_one_stores(dtype: torch.dtype, double_quant: bool) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    shape = (256, 1024)  # 4,096 blocks of 64: 16 nested blocks of 256
    real = nf4.storage(_real(shape, dtype, double_quant, dtype))
    with FakeTensorMode():
        model = nn.Sequential(nn.Linear(shape[1], shape[0], dtype=dtype))
        nf4.quantize_fake(model, _Workload(), compute_dtype=dtype, double_quant=double_quant)  # type: ignore[arg-type]
        host = nf4.storage(model)
        nf4.place_on_device(model)
        fake = nf4.storage(model)
    assert fake == host == real
    blocks = shape[0] * shape[1] // 64
    assert real["packed_bytes"] == shape[0] * shape[1] // 2 and real["packed_dtype"] == ["uint8"]
    assert real["absmax_bytes"] == blocks * (1 if double_quant else 4)
    assert real["nested_absmax_bytes"] == (4 * blocks // 256 if double_quant else 0)
    assert real["quantized_from"] == [str(dtype).removeprefix("torch.")]


def test_the_fake_quantization_leaves_bitsandbytes_code_cache_as_it_was() -> None:
    import bitsandbytes.functional as functional
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = dict(functional.name2qmap)
    with FakeTensorMode():
        model = nn.Sequential(nn.Linear(512, 256))
        nf4.quantize_fake(model, _Workload(), compute_dtype=torch.float32, double_quant=True)  # type: ignore[arg-type]
    assert functional.name2qmap.keys() == before.keys()
    assert all(functional.name2qmap[k] is v for k, v in before.items())
    _real((256, 512), torch.float32, True, torch.float32)  # a real quantization after it still runs


def _inside_gemm(layer: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(bytes the gemm_4bit op holds when it allocates its output, the output's bytes), from the profiler's
    memory events inside the op."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = layer(x)
    events = list(prof.profiler.kineto_results.events())  # type: ignore[union-attr]
    gemm = next(e for e in events if e.name() == "bitsandbytes::gemm_4bit")
    inside = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and gemm.start_ns() <= e.start_ns() <= gemm.end_ns())
    output = out.numel() * out.element_size()
    held = 0
    for _, nbytes in inside:
        if nbytes == output:
            return held, output
        held += nbytes
    raise AssertionError(f"no allocation of the output's {output} B inside gemm_4bit: {inside}")


@pytest.mark.parametrize("double_quant", [True, False], ids=["double-quant", "fp32-absmax"])
def test_the_sims_gemm_scratch_is_what_the_cpu_kernel_holds(double_quant: bool) -> None:
    """bitsandbytes' default gemm_4bit kernel (the CPU's) dequantizes the weight into the input's dtype (with
    double quantization, the absmax into fp32 first) and holds it when it allocates its output: what the sim adds
    as the op's scratch on the cpu-kernels profile. CUDA's fallback keeps the dequantized absmax and its sum with
    the offset both (``_dequant_linear_fallback``): one absmax more."""
    shape = (256, 512)
    layer = _real(shape, torch.bfloat16, double_quant, torch.bfloat16)[0]
    x = torch.randn(8, shape[1], dtype=torch.bfloat16, requires_grad=True)  # 8 x 256 x 2 B: no other size like it
    held, _ = _inside_gemm(layer, x)
    assert held == nf4.gemm_scratch_bytes(8, shape, torch.bfloat16, double_quant, "cpu")
    absmax = 4 * shape[0] * shape[1] // 64
    assert nf4.gemm_scratch_bytes(8, shape, torch.bfloat16, double_quant, "cuda") == held + (absmax if double_quant else 0)


def test_a_bad_gemm_path_is_named() -> None:
    from memclaims.core.errors import UsageError

    with pytest.raises(UsageError, match="unknown gemm_4bit path 'rocm'; valid paths: cuda, cpu"):
        nf4.gemm_scratch_bytes(1, (64, 64), torch.float32, False, "rocm")


# DistilBERT's pre_classifier stays too: memclaims' rule (since qlora was added) keeps every module whose name
# ends in a trained head's, which its Records were measured with.
@pytest.mark.parametrize(("workload", "kept"), [("distilbert", {"classifier", "pre_classifier"}),
                                                ("hf:llama", {"lm_head"})])
def test_the_head_and_the_output_embeddings_stay_unquantized(workload: str, kept: set[str]) -> None:
    recipe = resolve(workload, "smoke", ("qlora",))
    model, _ = recipe.workload.build_model(recipe.scale)
    quantized = {id(layer) for _, _, layer in nf4.base_layers(model, recipe.workload)}
    left = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if type(m) is nn.Linear and id(m) not in quantized}
    assert left == kept
    assert quantized
