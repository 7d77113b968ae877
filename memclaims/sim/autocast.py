"""CUDA's autocast policy for the ops where CPU autocast differs, emulated above autograd.

The sim runs mixed precision under ``torch.autocast("cpu")`` (CUDA autocast turns itself off
without a GPU). For a ViT the two policies cast the same ops; text models use ops where they do
not: on CUDA ``softmax`` / ``log_softmax`` / ``sum`` / ``cumsum`` of a half tensor return float32
(the ``fp32_set_opt_dtype`` list of ``aten/src/ATen/autocast_mode.cpp``), and ``pow``, ``exp``,
``log``, ``rsqrt``, ``layer_norm``, ``group_norm``... run in float32 (its ``fp32`` list); CPU
autocast keeps them in the half dtype. The eager attention's probabilities (B x H x L x L) and
``gelu_new``'s ``pow`` are where that changes memory. A ``TorchFunctionMode`` sits above autograd,
so the float32 copies a GPU saves for backward are what the replay saves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

Tensor = torch.Tensor
HALF = (torch.float16, torch.bfloat16)

# CUDA autocast's fp32 list, as Python entry points (the ones transformer models call).
_FP32 = {
    torch.pow, Tensor.pow, Tensor.__pow__, Tensor.__rpow__, torch.exp, Tensor.exp, torch.expm1, Tensor.expm1,
    torch.log, Tensor.log, torch.log1p, Tensor.log1p, torch.log2, Tensor.log2, torch.log10, Tensor.log10,
    torch.rsqrt, Tensor.rsqrt, torch.reciprocal, Tensor.reciprocal, torch.erfinv, Tensor.erfinv,
    torch.sinh, Tensor.sinh, torch.cosh, Tensor.cosh, torch.tan, Tensor.tan, torch.acos, Tensor.acos,
    torch.asin, Tensor.asin, F.softplus, F.layer_norm, torch.layer_norm, F.group_norm, torch.group_norm,
    torch.logsumexp, Tensor.logsumexp, torch.cdist, F.cosine_similarity, F.mse_loss, F.l1_loss,
    F.smooth_l1_loss, F.kl_div, F.nll_loss, F.binary_cross_entropy_with_logits,
}
# Its fp32_set_opt_dtype list: float32 output unless the caller named a dtype.
_SET_DTYPE = {
    F.softmax, torch.softmax, Tensor.softmax, F.log_softmax, torch.log_softmax, Tensor.log_softmax,
    torch.sum, Tensor.sum, torch.cumsum, Tensor.cumsum, torch.prod, Tensor.prod, torch.cumprod, Tensor.cumprod,
}


def _is_half(value: object) -> bool:
    return isinstance(value, Tensor) and value.dtype in HALF


class CudaAutocastPolicy(TorchFunctionMode):
    def __torch_function__(self, func: Callable[..., object], types: tuple[type, ...], args: tuple[object, ...] = (),
                           kwargs: dict[str, object] | None = None) -> object:
        kwargs = kwargs or {}
        if func in _SET_DTYPE and args and _is_half(args[0]) and kwargs.get("dtype") is None \
                and not any(isinstance(a, torch.dtype) for a in args):
            return func(*args, **{**kwargs, "dtype": torch.float32})
        if func in _FP32 and any(_is_half(a) for a in (*args, *kwargs.values())):
            def up(value: Any) -> object:
                return value.float() if _is_half(value) else value

            with torch.autocast("cpu", enabled=False):
                return func(*tree_map(up, args), **tree_map(up, kwargs))
        return func(*args, **kwargs)


@contextmanager
def cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    """``torch.autocast("cuda", dtype)`` as far as memory goes, on the CPU."""
    with torch.autocast("cpu", dtype=dtype), CudaAutocastPolicy():
        yield
