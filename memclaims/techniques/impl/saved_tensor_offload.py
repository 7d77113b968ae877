"""Activation offloading: ``torch.autograd.graph.save_on_cpu`` around the forward pass.

Every tensor autograd saves for backward goes through the hooks' pack function, which keeps it in
host memory (pinned where the run is on CUDA, so the copies back in backward can be asynchronous)
and frees the device copy once nothing else holds it; backward unpacks each to the device as it
needs it. What the run can observe everywhere is what went through the pack function: the bytes
it held on the host. On the cpu tier that is all there is to see, since the saved tensors already
live on the host (``tensor.cpu()`` of a CPU tensor is the tensor itself: nothing moves, and the
device peak cannot drop); on CUDA and on the sim the forward's device peak drops as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_leaves

from memclaims.techniques.base import LoopHelper, Observed, observations


def host_bytes(packed: object) -> int:
    """Bytes of the host tensors in what a pack function returned (save_on_cpu: ``(device, tensor)``)."""
    return sum(leaf.nbytes for leaf in tree_leaves(packed)
               if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu")


class ActivationOffload(LoopHelper):
    """Makes the hooks for each forward pass and counts what their pack function put on the host
    in the passes it is asked to count (the first measured one: ``offloaded_activation_bytes`` of ``technique``'s
    part of the Record)."""

    def __init__(self, device_type: str, technique: str) -> None:
        self.pin_memory = device_type == "cuda"
        self.technique = technique
        self.host_bytes: int | None = None

    def hooks(self) -> saved_tensors_hooks:
        """torch's own offloader; a subclass (the sim's) makes another."""
        return torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory)

    def held_on_host(self, packed: object) -> int:
        """Bytes of host memory in what the pack function returned."""
        return host_bytes(packed)

    def forward(self, count: bool) -> saved_tensors_hooks:
        """The context for one forward pass; ``count``: add what it packs to ``host_bytes``."""
        hooks = self.hooks()
        if not count:
            return hooks
        self.host_bytes = self.host_bytes or 0
        pack: Callable[[torch.Tensor], object] = hooks.pack_hook

        def counted(tensor: torch.Tensor) -> Any:
            packed = pack(tensor)
            self.host_bytes = (self.host_bytes or 0) + self.held_on_host(packed)
            return packed

        hooks.pack_hook = counted  # read when the hooks are entered, so this one is pushed
        return hooks

    def forward_context(self) -> saved_tensors_hooks:
        """The loop's forward pass under the hooks; the first pass under them counts what they offload."""
        return self.forward(count=self.host_bytes is None)

    def measured_fields(self) -> Observed:
        return observations(self.technique, offloaded_activation_bytes=self.host_bytes)
