"""DDP's gradient buckets on one rank (``ddp``: the LLM bonus's bigbird-before), for the sim's replay.

Lightning's ``DDPStrategy`` passes no options to ``torch.nn.parallel.DistributedDataParallel``
(``lightning/fabric/strategies/ddp.py``: ``DistributedDataParallel(module, device_ids, **{})``), so
torch's defaults hold: ``bucket_cap_mb`` 25 MiB (``_DEFAULT_BUCKET_CAP_MB``), a first bucket of
``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), and ``gradient_as_bucket_view=False``: each bucket is a
flat tensor of its own, beside the parameters' ``.grad``, allocated when the Reducer is built (at
``fabric.setup``) and alive for the whole run. So a DDP rank holds the whole model, its gradients and
its optimizer state as one device does, plus one more gradient-sized set of bucket storage.

The buckets modelled are the ones the Reducer rebuilds after the first iteration (gradient-ready
order, the reverse of the parameters' order; a bucket closes once it reaches its cap), which
stay for the rest of the run; the first iteration's buckets, by parameter order, hold the same
bytes in a different split and are freed at the rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MIB = 1024 * 1024
BUCKET_CAP_BYTES = 25 * MIB  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def bucket_numels(params: Sequence[torch.Tensor], first_cap: int = FIRST_BUCKET_BYTES,
                  cap: int = BUCKET_CAP_BYTES) -> list[tuple[torch.dtype, int]]:
    """(dtype, elements) of each bucket, as torch's ``compute_bucket_assignment_by_size`` groups
    ``params`` in gradient-ready order: one open bucket per dtype, closed once its bytes reach the
    current cap (the first bucket's cap, then ``cap``)."""
    buckets: list[tuple[torch.dtype, int]] = []
    open_numel: dict[torch.dtype, int] = {}
    limit: dict[torch.dtype, int] = {}
    for param in reversed(params):
        if not param.requires_grad:
            continue
        dtype = param.dtype
        open_numel[dtype] = open_numel.get(dtype, 0) + param.numel()
        if open_numel[dtype] * dtype.itemsize >= limit.setdefault(dtype, first_cap):
            buckets.append((dtype, open_numel.pop(dtype)))
            limit[dtype] = cap
    buckets.extend(open_numel.items())
    return buckets


def allocate_buckets(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The bucket storages, allocated where the caller counts device memory (the sim's session)."""
    return [torch.empty(numel, dtype=dtype) for dtype, numel in bucket_numels(params)]
