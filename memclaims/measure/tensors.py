"""Bytes of tensors as the probes and the Records count them: distinct storages, grouped by dtype or
device, and an optimizer's state tensors. Apart from the probes so that the training loop, which
counts the gradients' bytes, need not import them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


def storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared storages count once)."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        key = storage.data_ptr() if storage.data_ptr() else id(storage)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def bytes_by(tensors: Iterator[torch.Tensor], key: Callable[[torch.Tensor], str]) -> dict[str, int]:
    """Bytes of the distinct storages behind ``tensors``, grouped by ``key`` (dtype, device type)."""
    groups: dict[str, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(key(tensor), []).append(tensor)
    return {name: storage_bytes(iter(members)) for name, members in sorted(groups.items())}


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def device_type(tensor: torch.Tensor) -> str:
    return tensor.device.type


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """The tensors an optimizer's state holds; a state that is a tensor subclass wrapping others (torchao's
    low-bit states: codes, scales, a quantization map) as the plain tensors behind it, which own the storages."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for state in optimizer.state.values():
        for value in state.values():
            if not isinstance(value, torch.Tensor):
                continue
            pending = [value]
            while pending:
                tensor = pending.pop()
                if is_traceable_wrapper_subclass(tensor):
                    names, _ = tensor.__tensor_flatten__()
                    # torch 2.14's DTensor flattens its device mesh too: only the tensors own storages.
                    inner = [getattr(tensor, name) for name in names]
                    pending.extend(reversed([part for part in inner if isinstance(part, torch.Tensor)]))
                else:
                    yield tensor
