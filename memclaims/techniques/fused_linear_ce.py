"""fused-linear-ce: the causal LM's vocabulary projection and cross-entropy fused and chunked over the tokens
(``torch.nn.functional.linear_cross_entropy`` with ``LinearCrossEntropyOptions``): the (tokens x vocabulary)
logits are never materialized whole. One module holds all of it: the registry entry, the hooks, the torch code on
real tensors and its replay on the sim's fake ones (torch imported when a hook runs: the registry loads first).

On a real device: the loss from the last hidden states and the vocabulary projection's weight in one chunked
op, ``torch.nn.functional.linear_cross_entropy`` with ``LinearCrossEntropyOptions()`` (torch's own; no maintained library does it on the CPU: Liger's and
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

On the simulated GPU: torch's chunked ``linear_cross_entropy`` as it runs on CUDA, replayed on fake CPU tensors.

Under ``FakeTensorMode`` the op (a ``torch.library.custom_op``, ``torch_nn::_linear_cross_entropy_batch_chunked``)
runs its registered fake, which allocates only its outputs: the scalar loss and the gradients it precomputes
in forward and keeps for backward (input-sized and weight-sized, in the input's dtype). The per-chunk
scratch its eager body allocates (``_ChunkContext.build`` in torch/nn/modules/linear_cross_entropy.py, torch
2.14) is added here around the call, with the buffer choices CUDA makes under the ``compact`` accumulation
policy that ``acc_policy="auto"`` picks on an accelerator:

- ``logits_buf`` (chunk x vocabulary) in the accumulation dtype (fp32; fp16 inputs keep it in fp16) and its
  row buffer ``tmp`` (chunk);
- half inputs: ``input_chunk_acc_buf`` (chunk x features, fp32), and for bf16 a bf16 copy of the chunk's
  logits for the input gradient's matmul (``logits_downcast``, made per chunk: one at a time);
- ``neg_weight_target`` (tokens, accumulation dtype) and ``corrected_target`` (tokens, int64).

The options are resolved as CUDA resolves ``LinearCrossEntropyOptions()`` on a GPU of compute capability
8.0 or more (every profile's): ``compact``, fp32 accumulation for half inputs, and the ``aspect_ratio``
chunk capped so the chunked peak stays under the reference's; the replay passes them explicitly, since the
fake tensors' device is the CPU, where ``auto`` would pick ``accurate``.

What shows it: the op's calls, chunk and fallbacks (the Record's ``fused_loss_*`` fields; ``check``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from memclaims.techniques.base import Hooks, LoopHelper, Observed, Say, Technique, observations
from memclaims.techniques.shared_conflicts import STRATEGY

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn import LinearCrossEntropyOptions  # torch >= 2.14, as the locked releases

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import RealRun, SimLoop, SimSession

NAME = "fused-linear-ce"  # the technique's registry name, and its part of the Record (``by_technique``)

# The op's one warning when it ignores ``options`` and runs the reference path (torch/nn/functional.py:
# "linear_cross_entropy: ``options`` ignored; chunked path needs ..."): a fused loss that silently
# materializes the logits.
FALLBACK_WARNING = "linear_cross_entropy: ``options`` ignored"


@cache
def hidden_states_head() -> type[nn.Module]:
    """``HiddenStatesHead``, the class (made on first use: torch loads after the registry)."""
    from torch import nn

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

    return HiddenStatesHead


def apply(model: nn.Module, head_of: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """``model`` with its vocabulary projection (``head_of(model)``, the workload's ``fused_loss_head``)
    wrapped in a ``HiddenStatesHead``, in place; returns the model."""
    head = head_of(model)
    for module in model.modules():
        for child_name, child in module.named_children():
            if child is head:
                setattr(module, child_name, hidden_states_head()(head))
                return model
    raise ValueError(f"the vocabulary projection {type(head).__name__} is not a submodule of {type(model).__name__}")


def bypassed_head(model: nn.Module) -> nn.Module | None:
    """The projection a ``HiddenStatesHead`` of ``model`` wraps, or None when none does."""
    wrapper = hidden_states_head()
    return next((cast(Any, m).head for m in model.modules() if isinstance(m, wrapper)), None)


class FusedLoss(LoopHelper):
    """The engines' loss for a ``fused-linear-ce`` recipe, and what it saw for the Record (the loop's helper).
    The sim replays it on fake tensors with the options CUDA resolves to (:class:`SimulatedFusedLoss`)."""

    def __init__(self, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype
        self.calls = 0
        self.fallbacks: list[str] = []
        self.rows: int | None = None  # tokens of the last call
        self.classes: int | None = None  # the vocabulary
        self.chunk_rows: int | None = None  # the op's batch_chunk_size for them (LinearCrossEntropyOptions._adjust)

    def options(self, hidden: torch.Tensor, classes: int) -> LinearCrossEntropyOptions:
        """torch's defaults, resolved by the op for the device and dtype at each call."""
        from torch.nn import LinearCrossEntropyOptions  # torch >= 2.14

        return LinearCrossEntropyOptions()

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None,
            options: LinearCrossEntropyOptions) -> torch.Tensor:
        import torch.nn.functional as F

        loss: torch.Tensor = F.linear_cross_entropy(  # torch >= 2.14
            hidden, weight, targets, linear_bias=bias, options=options)
        return loss

    def __call__(self, model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

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

    def measured_fields(self) -> Observed:
        """The technique's part of the Record: the op's calls, the tokens of the last call, its classes (the
        vocabulary), the rows of one chunk of the tokens (the op's resolved batch_chunk_size: the logits buffer is
        chunk x vocabulary), and calls in which the op ignored its options and materialized the logits whole."""
        return observations(NAME, fused_loss_calls=self.calls, fused_loss_rows=self.rows,
                            fused_loss_classes=self.classes, fused_loss_chunk_rows=self.chunk_rows,
                            fused_loss_fallbacks=len(self.fallbacks))


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class SimulatedFusedLoss(FusedLoss):
    """:class:`FusedLoss` with CUDA's resolved options and the op's scratch on the simulated device."""

    def options(self, hidden: torch.Tensor, classes: int) -> LinearCrossEntropyOptions:
        from torch.nn import LinearCrossEntropyOptions  # torch >= 2.14

        dtype = hidden.dtype
        rows, features = hidden.shape
        cuda = LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=_accumulation_dtype(dtype))._adjust(
            num_batches=rows, in_features=features, num_classes=classes, dtype=dtype, device=None)
        # The chunk as CUDA sizes it, given explicitly: the fake CPU device would resolve another one.
        return LinearCrossEntropyOptions(batch_chunk_size=cuda.batch_chunk_size, chunking_method=None,
                                         acc_policy="compact", acc_dtype=cuda.acc_dtype)

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None,
            options: Any) -> torch.Tensor:  # options() above: its batch_chunk_size given, never None
        import torch

        dtype, chunk = hidden.dtype, int(options.batch_chunk_size)
        rows, features = hidden.shape
        accumulation = _accumulation_dtype(dtype)
        logits_dtype = dtype if dtype == torch.float16 else accumulation
        scratch = [torch.empty((chunk, weight.shape[0]), dtype=logits_dtype), torch.empty(chunk, dtype=logits_dtype),
                   torch.empty(rows, dtype=accumulation), torch.empty(rows, dtype=torch.int64)]
        if accumulation != dtype:
            scratch.append(torch.empty((chunk, features), dtype=accumulation))
        if dtype == torch.bfloat16:
            scratch.append(torch.empty((chunk, weight.shape[0]), dtype=dtype))
        loss = super().run(hidden, weight, targets, bias, options)
        del scratch
        return loss


def _head(recipe: Recipe) -> Callable[[nn.Module], nn.Module]:
    head = recipe.workload.fused_loss_head
    assert head is not None, "recipe.resolve refuses fused-linear-ce on a workload without a vocabulary projection"
    return head


class FusedLinearCrossEntropy(Hooks):
    def attach(self, engine: RealRun) -> None:
        from memclaims.core.precision import PRECISIONS

        engine.helpers.append(FusedLoss(PRECISIONS[engine.precision_ran].compute_dtype))  # under what Lightning ran

    def convert_module(self, model: nn.Module, engine: RealRun) -> nn.Module:
        return apply(model, _head(engine.recipe))  # the head bypassed in training, before any adapters

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """The chunked op ran for every micro-batch, on its chunked path, in chunks smaller than the tokens
        (one chunk of all of them would be the reference's logits buffer again)."""
        calls, rows, chunk = (record.observed(NAME, key) for key in
                              ("fused_loss_calls", "fused_loss_rows", "fused_loss_chunk_rows"))
        fallbacks = record.observed(NAME, "fused_loss_fallbacks")
        micro_batches = (record.step_micro_batches or 1) * record.memory_steps
        if not calls or calls < micro_batches:
            say(f"fused_loss_calls is {calls} after phase train for {micro_batches} micro-batches: the loss was "
                "computed from materialized logits (F.cross_entropy), not by linear_cross_entropy")
        elif fallbacks:
            say(f"fused_loss_fallbacks is {fallbacks} after phase train: linear_cross_entropy "
                "ignored its options and ran the reference path, logits whole")
        elif rows is None or chunk is None or chunk >= rows:
            say(f"fused_loss_chunk_rows is {chunk} for {rows} tokens after phase train: one chunk of every token "
                "materializes the whole logits")

    def sim_attach(self, loop: SimLoop, session: SimSession) -> None:
        loop.helpers.append(SimulatedFusedLoss(loop.precision.compute))

    def sim_adapt(self, model: nn.Module, recipe: Recipe, move: Callable[[nn.Module, torch.dtype | None], None]) -> nn.Module:
        head = recipe.workload.fused_loss_head
        return model if head is None else apply(model, head)


# The strategies shard or wrap the vocabulary projection; memclaims' fused loss reads its weight outside the
# model's forward, which FSDP frees (resharded) and the ranks' engines compute the loss from logits.
_CONFLICTS: tuple[tuple[str, str], ...] = (
    (STRATEGY, "memclaims computes the fused loss in the one-device engines only: it reads the vocabulary projection's "
               "weight after the forward, which FSDP has resharded, and the multi-rank engines compute the loss from "
               "logits"),)
_WORKLOADS = ("fused_loss_head", "the fused linear + cross-entropy replaces a causal LM's vocabulary projection and "
              "its loss (hf: workloads with the causal-lm head whose logits are the plain projection, without "
              "soft-capping or scaling); this workload has none")

ENTRY = Technique(NAME, "the causal LM's vocabulary projection and cross-entropy fused and chunked over "
                  "the tokens (torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions): the logits "
                  "are never materialized whole", "torch docs: linear_cross_entropy", in_cover=False,
                  requires=frozenset({"linear_cross_entropy"}), conflicts=_CONFLICTS, workload_needs=_WORKLOADS,
                  hooks=FusedLinearCrossEntropy())
