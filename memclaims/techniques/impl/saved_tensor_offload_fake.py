"""Activation offloading on the simulated GPU: ``save_on_cpu``'s pack and unpack, in device accounting.

The replay runs on fake *CPU* tensors, where torch's own ``save_on_cpu`` keeps every saved tensor
as it is (``tensor.cpu()`` of a CPU tensor is itself). These hooks do what it does on a GPU instead:
pack makes the host copy outside the device's accounting (``DeviceMemory.counting`` off), so the
device storage is freed once nothing else holds it; unpack makes the device copy back, counted, in
backward, where autograd frees it after use. A saved parameter is copied too (torch does the same)
and stays on the device, being a parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_leaves

from memclaims.techniques.impl.saved_tensor_offload import ActivationOffload

if TYPE_CHECKING:
    from memclaims.techniques.engine_protocols import SimDeviceMemory


class SimulatedOffload(ActivationOffload):
    def __init__(self, memory: SimDeviceMemory, technique: str) -> None:
        super().__init__("cuda", technique)
        self.memory = memory

    def hooks(self) -> saved_tensors_hooks:
        memory = self.memory

        def pack(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
            with memory.outside():
                host = torch.empty_like(tensor)
            return tensor.device, host

        def unpack(packed: tuple[torch.device, torch.Tensor]) -> Any:
            device, host = packed
            return torch.empty_like(host, device=device)  # counted: the device copy backward reads

        return saved_tensors_hooks(pack, unpack)

    def held_on_host(self, packed: object) -> int:
        # Every fake tensor is a "cpu" tensor: the host's are those the device's accounting does not hold.
        return self.memory.host_bytes(leaf for leaf in tree_leaves(packed) if isinstance(leaf, torch.Tensor))
