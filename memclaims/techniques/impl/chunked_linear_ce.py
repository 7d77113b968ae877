"""The ``fused-linear-ce`` technique: a causal LM's loss from its last hidden states and the vocabulary
projection's weight in one chunked op, ``torch.nn.functional.linear_cross_entropy`` with
``LinearCrossEntropyOptions()`` (torch's own; no maintained library does it on the CPU: Liger's and
Apple's cut-cross-entropy kernels are Triton, CUDA only).

The reference computes ``logits = lm_head(hidden)`` (tokens x vocabulary, 0.82 GB in fp32 for GPT-2 at
8 x 512 tokens) and keeps them and their gradient for backward. The chunked op walks the tokens in chunks
of ``batch_chunk_size`` rows, computing each chunk's logits, softmax and gradients in forward; its backward
only scales the precomputed input and weight gradients by the upstream gradient.

How memclaims applies it: the workload's vocabulary projection is wrapped in ``HiddenStatesHead``, which
passes the hidden states through in training mode (so the model's forward returns them where it returned
logits) and computes the logits in eval mode (the accuracy phase reads logits as before). The engines then
call :class:`FusedLoss` instead of ``F.cross_entropy``. The op runs in the recipe's compute dtype, as the
head's linear layer did (under autocast, the half dtype; the op is no autocast op, so the hidden states and
the weight are cast to it here, as autocast casts a linear's operands): Fabric's ``convert_output`` hands the
hidden states back in fp32 under every precision.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from memclaims.techniques.base import LoopHelper

# The op's one warning when it ignores ``options`` and runs the reference path (torch/nn/functional.py:
# "linear_cross_entropy: ``options`` ignored; chunked path needs ..."): a fused loss that silently
# materializes the logits.
FALLBACK_WARNING = "linear_cross_entropy: ``options`` ignored"


class HiddenStatesHead(nn.Module):
    """The vocabulary projection, bypassed while training: the model's forward returns the hidden states
    in place of the logits, and :class:`FusedLoss` applies ``head``'s weight inside the chunked loss.
    The wrapped ``nn.Linear`` keeps its parameter (and a tied embedding keeps its tie)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.training:
            return hidden
        result: torch.Tensor = self.head(hidden)
        return result


def apply(model: nn.Module, head_of: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """``model`` with its vocabulary projection (``head_of(model)``, the workload's ``fused_loss_head``)
    wrapped in a :class:`HiddenStatesHead`, in place; returns the model."""
    head = head_of(model)
    for module in model.modules():
        for child_name, child in module.named_children():
            if child is head:
                setattr(module, child_name, HiddenStatesHead(head))
                return model
    raise ValueError(f"the vocabulary projection {type(head).__name__} is not a submodule of {type(model).__name__}")


def bypassed_head(model: nn.Module) -> nn.Module | None:
    """The projection a :class:`HiddenStatesHead` of ``model`` wraps, or None when none does."""
    return next((m.head for m in model.modules() if isinstance(m, HiddenStatesHead)), None)


class FusedLoss(LoopHelper):
    """The engines' loss for a ``fused-linear-ce`` recipe, and what it saw for the Record. The sim
    replays it on fake tensors with the options CUDA resolves to (memclaims.techniques.impl.chunked_linear_ce_fake)."""

    def __init__(self, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype
        self.calls = 0
        self.fallbacks: list[str] = []
        self.rows: int | None = None  # tokens of the last call
        self.classes: int | None = None  # the vocabulary
        self.chunk_rows: int | None = None  # the op's batch_chunk_size for them (LinearCrossEntropyOptions._adjust)

    def options(self, hidden: torch.Tensor, classes: int) -> Any:
        """torch's defaults, resolved by the op for the device and dtype at each call."""
        from torch.nn import LinearCrossEntropyOptions  # torch >= 2.14

        return LinearCrossEntropyOptions()

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None,
            options: Any) -> torch.Tensor:
        loss: torch.Tensor = F.linear_cross_entropy(  # torch >= 2.14
            hidden, weight, targets, linear_bias=bias, options=options)
        return loss

    def __call__(self, model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        head = bypassed_head(model)
        weight = cast(torch.Tensor, head.weight) if head is not None else None
        if weight is None or hidden.shape[-1] != weight.shape[-1]:
            # The head computed logits: nothing to fuse; the loss the reference computes.
            return F.cross_entropy(hidden, targets)
        bias: torch.Tensor | None = getattr(head, "bias", None)
        hidden, weight = hidden.to(self.compute_dtype), weight.to(self.compute_dtype)
        bias = bias.to(self.compute_dtype) if bias is not None else None
        rows, features = hidden.shape
        options = self.options(hidden, weight.shape[0])
        # What the op resolves them to on this device: the rows of one chunk.
        resolved = options._adjust(num_batches=rows, in_features=features, num_classes=weight.shape[0],
                                   dtype=hidden.dtype, device=hidden.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = self.run(hidden, weight, targets, bias, options)
        for warning in caught:
            text = str(warning.message)
            if text.startswith(FALLBACK_WARNING):
                self.fallbacks.append(text)
            else:  # not ours to swallow
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        self.calls += 1
        self.rows, self.classes, self.chunk_rows = rows, int(weight.shape[0]), int(resolved.batch_chunk_size)
        return loss

    def loss(self, model: nn.Module, output: Any, targets: Any) -> torch.Tensor:
        """The engines' loss: the "logits" the model returned are the hidden states."""
        return self(model, output, targets)

    def compute_dtypes(self, seen: list[str]) -> list[str]:
        """The head's matmul ran inside the loss, in the recipe's compute dtype."""
        if not self.calls:
            return seen
        return sorted({*seen, str(self.compute_dtype).removeprefix("torch.")})

    def measured_fields(self) -> dict[str, Any]:
        """The Record's fused-loss fields."""
        return {"fused_loss_calls": self.calls, "fused_loss_rows": self.rows, "fused_loss_classes": self.classes,
                "fused_loss_chunk_rows": self.chunk_rows, "fused_loss_fallbacks": len(self.fallbacks)}
