"""A user workload's inputs for the sim, from the shapes and dtypes of one real batch of its data.

The sim replays a training step on fake tensors and reads no data set; what it needs from the
data is what a batch on the device looks like. ``BatchShapes`` collates the first ``batch``
examples of the training set (the collate function the DataLoader gets, or its default) once per
scale, keeps each tensor's shape and dtype (dimension 0 is the batch, as ``default_collate`` and
every padding collate lay it out), and makes empty tensors of those shapes at any batch size.
Padded batches take the length of the longest of those first examples.

Dimension 0 may also be the batch flattened with the positions of each example: labels of a language
model viewed as ``(batch x sequence,)`` (``target.view(-1)``, as Lightning's demo Transformer and many
LM losses take them) lead with ``n x k`` for ``n`` examples of ``k`` positions each, and scale as ``batch x k``.
A leading dimension that is no multiple of the examples collated is not the batch's, and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.data import Dataset, default_collate

from memclaims.core.errors import UsageError

if TYPE_CHECKING:
    from torch.utils._pytree import TreeSpec

    from memclaims.workloads.types import Scale


@dataclass(frozen=True)
class _Leaf:
    shape: tuple[int, ...]  # without the batch dimension
    dtype: torch.dtype
    # Rows of dimension 0 per example: 1 where it is the batch, k where it is the batch flattened
    # with k positions of each example (labels viewed as (batch x sequence,)).
    per_example: int = 1


class BatchShapes:
    """``(scale, batch) -> (inputs, labels)`` of empty tensors shaped as the workload's real batches."""

    def __init__(self, workload: str, train_data: Callable[[Scale], Dataset[Any]],
                 collate_fn: Callable[[list[Any]], Any] | None) -> None:
        self.workload, self.train_data = workload, train_data
        self.collate = collate_fn or default_collate
        self._read: dict[Scale, tuple[list[_Leaf | object], TreeSpec]] = {}

    def _leaves(self, scale: Scale) -> tuple[list[_Leaf | object], TreeSpec]:
        if scale not in self._read:
            # The sim calls this inside its fake-tensor and tracking modes: the data set is real
            # host data, read with those modes off (nothing of it reaches the simulated device).
            with _disable_current_modes():
                dataset = self.train_data(scale)
                count = min(scale.batch_size, len(cast(Sized, dataset)))  # a Dataset declares no __len__
                batch = self.collate([dataset[i] for i in range(count)])
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise UsageError(f"workload {self.workload!r}: a collated batch must be (inputs, labels), got "
                                 f"{type(batch).__name__}; the sim shapes its fake batches from it")
            leaves, spec = tree_flatten(batch)
            kept: list[_Leaf | object] = []
            for leaf in leaves:
                if isinstance(leaf, torch.Tensor):
                    if leaf.dim() == 0 or leaf.shape[0] == 0 or leaf.shape[0] % count:
                        raise UsageError(f"workload {self.workload!r}: a collated tensor of shape {tuple(leaf.shape)} "
                                         f"does not lead with the batch dimension ({count} examples), nor with the "
                                         f"batch flattened with each example's positions ({count} x k); the sim "
                                         "needs one of them first")
                    kept.append(_Leaf(tuple(leaf.shape[1:]), leaf.dtype, leaf.shape[0] // count))
                else:
                    kept.append(leaf)
            self._read[scale] = (kept, spec)
        return self._read[scale]

    def __call__(self, scale: Scale, batch: int) -> tuple[object, torch.Tensor]:
        kept, spec = self._leaves(scale)
        made = [torch.zeros((batch * leaf.per_example, *leaf.shape), dtype=leaf.dtype) if isinstance(leaf, _Leaf)
                else leaf for leaf in kept]
        inputs, labels = tree_unflatten(made, spec)
        return inputs, labels
