"""The ``lora`` technique on the sim's fake tensors: ``memclaims.techniques.impl.peft_adapters.apply``, as the real engines call it.

peft builds the adapters as ordinary ``nn.Linear`` modules (fake tensors, counted where a GPU run would
allocate them) and then moves each onto its base layer's device and dtype with ``Module.to``. On fake
parameters ``Module._apply`` always swaps tensors (``torch.utils.swap_tensors``), which the fake mode's
weak references refuse ("Couldn't swap Linear.weight"). Every fake tensor is on the one fake device, so
while peft wraps the model ``Module.to`` keeps only a dtype conversion, replayed as the sim's ``_move``
does (a new storage per floating tensor) and only where a tensor's dtype changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from memclaims.techniques.impl import peft_adapters as lora


@contextmanager
def _fake_to(move: Callable[[nn.Module, torch.dtype], None]) -> Iterator[None]:
    original = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        _device, dtype, _non_blocking, _format = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and any(t.is_floating_point() and t.dtype != dtype
                                     for t in (*self.parameters(), *self.buffers())):
            move(self, dtype)
        return self

    nn.Module.to = to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.to = original  # type: ignore[method-assign]


def apply(model: nn.Module, workload: str, chosen: dict[str, object], asked: bool,
          move: Callable[[nn.Module, torch.dtype], None]) -> nn.Module:
    """``model`` with its LoRA adapters (``peft_adapters.apply``'s arguments), built on fake tensors; ``move``: the
    sim's dtype conversion."""
    with _fake_to(move):
        return lora.apply(model, workload, chosen, asked)
