"""bitsandbytes' 8-bit Adam / AdamW on the simulated GPU: their device memory, by layout arithmetic.

bitsandbytes' kernels read real data, so its optimizers do not run on fake tensors (SIMULATION.md
point 8). What they hold on the device is exact arithmetic instead, read from the installed
library by ``memclaims.core.optim_state.eight_bit_layout`` (block size, ``min_8bit_size``, the two
quantization maps, ``max_unorm``), and allocated here in the order ``Optimizer2State.init_state``
allocates it at a parameter's first step:

- a parameter of ``min_8bit_size`` elements or more: ``state1`` and ``state2`` as uint8 like the
  parameter, one float32 ``absmax`` per block of ``blocksize`` per state, and the signed and unsigned
  256-entry maps, moved to the device once and shared by every parameter (one storage each);
- a smaller parameter: ``state1`` and ``state2`` in float32 (whatever the parameter's dtype);
- ``unorm_vec`` (one float32) only when ``max_unorm > 0`` (not by default).

The paged optimizer (PagedAdamW8bit) allocates ``state1`` and ``state2`` of a parameter of
``PAGED_MIN_NUMEL`` elements or more in CUDA unified memory instead: not in the caching allocator,
so outside the device's accounting here (``outside``, ``DeviceMemory.outside``).

The step itself (``optimizer_update_8bit_blockwise`` / ``optimizer_update_32bit``) is one fused
kernel per parameter that updates the parameter, the states and ``absmax`` in place: it allocates
no temporaries on the device (``update_step`` calls nothing else with the default
``percentile_clipping=100``), so the model allocates none. The step counter is a Python int.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from memclaims.core.optim_state import FP32, EightBitLayout
from memclaims.measure import optimizers


class EightBitStateModel(torch.optim.Optimizer):
    """Allocates what a bitsandbytes 2-state 8-bit optimizer holds on the device; updates nothing."""

    def __init__(self, params: Any, layout: EightBitLayout,
                 outside: Callable[[], AbstractContextManager[None]] | None = None, **defaults: Any) -> None:
        super().__init__(params, defaults)
        self.layout = layout
        self._maps: tuple[torch.Tensor, torch.Tensor] | None = None
        self._outside = outside  # paged: where unified memory is allocated (None: not paged)

    def _buffer(self, param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``get_state_buffer``: a large state of a paged optimizer in unified memory."""
        paged = self._outside is not None and param.numel() >= optimizers.PAGED_MIN_NUMEL
        with self._outside() if paged and self._outside is not None else nullcontext():
            return torch.zeros_like(param, dtype=dtype)

    def _quantization_maps(self) -> tuple[torch.Tensor, torch.Tensor]:
        # ``name2qmap[...].to(p.device)``: the first 8-bit parameter moves the maps to the device;
        # later ones get the same device tensors back.
        if self._maps is None:
            signed, unsigned = self.layout.qmap_bytes
            self._maps = (torch.empty(signed // FP32, dtype=torch.float32),
                          torch.empty(unsigned // FP32, dtype=torch.float32))
        return self._maps

    def _init_state(self, param: torch.Tensor) -> None:
        layout, state, numel = self.layout, self.state[param], param.numel()
        state["step"] = 0
        if numel < layout.min_8bit_size:
            state["state1"] = self._buffer(param, torch.float32)
            state["state2"] = self._buffer(param, torch.float32)
        else:
            qmap1, qmap2 = self._quantization_maps()
            blocks = -(-numel // layout.blocksize)
            state["state1"] = self._buffer(param, torch.uint8)
            state["qmap1"] = qmap1
            state["state2"] = self._buffer(param, torch.uint8)
            state["qmap2"] = qmap2
            state["absmax1"] = torch.zeros((blocks,), dtype=torch.float32)
            state["absmax2"] = torch.zeros((blocks,), dtype=torch.float32)
        if layout.unorm_bytes:
            state["unorm_vec"] = torch.zeros((1,), dtype=torch.float32)

    # Narrower than Optimizer.step's overloads on purpose: the state model computes no loss, so it
    # takes no closure to return one from.
    @torch.no_grad()
    def step(self, closure: object = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not self.state[param]:
                    self._init_state(param)
                self.state[param]["step"] += 1


def build(name: str, model: nn.Module, learning_rate: float, layout: EightBitLayout,
          outside: Callable[[], AbstractContextManager[None]] | None = None) -> EightBitStateModel:
    """The course's 8-bit optimizer (``memclaims.measure.optimizers.build``'s groups and arguments), as a
    state model; ``outside``: where a paged optimizer's unified memory is allocated."""
    hf = optimizers.training_arguments_defaults()
    return EightBitStateModel(optimizers.parameter_groups(model), layout,
                              outside if name in optimizers.PAGED else None, lr=learning_rate,
                              betas=(hf["adam_beta1"], hf["adam_beta2"]), eps=hf["adam_epsilon"],
                              kind=optimizers.EIGHT_BIT[name])
