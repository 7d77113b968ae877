"""The ``fused-linear-ce`` technique on the simulated GPU: torch's chunked ``linear_cross_entropy`` as it
runs on CUDA, replayed on fake CPU tensors.

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
"""

from __future__ import annotations

from typing import Any

import torch

from memclaims.techniques.impl.chunked_linear_ce import FusedLoss


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class SimulatedFusedLoss(FusedLoss):
    """:class:`FusedLoss` with CUDA's resolved options and the op's scratch on the simulated device."""

    def options(self, hidden: torch.Tensor, classes: int) -> Any:
        from torch.nn import LinearCrossEntropyOptions  # torch >= 2.14

        dtype = hidden.dtype
        rows, features = hidden.shape
        cuda = LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=_accumulation_dtype(dtype))._adjust(
            num_batches=rows, in_features=features, num_classes=classes, dtype=dtype, device=None)
        # The chunk as CUDA sizes it, given explicitly: the fake CPU device would resolve another one.
        return LinearCrossEntropyOptions(batch_chunk_size=cuda.batch_chunk_size, chunking_method=None,
                                         acc_policy="compact", acc_dtype=cuda.acc_dtype)

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None,
            options: Any) -> torch.Tensor:
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
