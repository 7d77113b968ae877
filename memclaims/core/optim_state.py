"""Exact arithmetic for optimizer-state bytes, so measured state sizes are checked, not just recorded.

The 8-bit layout is read from the installed bitsandbytes (its ``min_8bit_size`` default, the block
size and quantization maps its ``init_state`` creates), never hard-coded: an upgrade that changes
the layout changes the expectation with it, and the tests compare the two.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

MIB = 2**20
FP32 = 4  # bytes; bitsandbytes keeps small tensors' states and the absmax values in float32


def count_every_tensor(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state``, each counted where it appears.

    bitsandbytes puts the same two quantization maps in every 8-bit parameter's state; this counts
    them once per parameter (how the course's figure and ARTICLE.md's 134,082,160 B count), while
    ``memclaims.measure.tensors.storage_bytes`` counts each storage once (what the memory actually holds).
    """
    return sum(v.numel() * v.element_size()
               for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


@dataclass(frozen=True)
class EightBitLayout:
    """How bitsandbytes' 2-state 8-bit optimizers (Adam8bit, AdamW8bit) lay out their state."""

    version: str
    min_8bit_size: int  # parameters with fewer elements keep float32 states
    blocksize: int  # one float32 absmax per block, per state
    qmap_bytes: tuple[int, int]  # the signed and unsigned 256-entry maps
    state_itemsize: int  # bytes per element of the quantized states
    unorm_bytes: int  # max_unorm > 0 adds a 1-element float32 per parameter

    def parameter_bytes(self, numel: int, shared_qmaps: bool = False) -> int:
        """State bytes of one parameter after a step (``shared_qmaps``: leave the maps out)."""
        if numel < self.min_8bit_size:
            return 2 * numel * FP32 + self.unorm_bytes
        blocks = math.ceil(numel / self.blocksize)
        maps = 0 if shared_qmaps else sum(self.qmap_bytes)
        return 2 * numel * self.state_itemsize + 2 * blocks * FP32 + maps + self.unorm_bytes

    def total_bytes(self, numels: Iterable[int], every_tensor: bool = True) -> int:
        """All parameters' state; ``every_tensor=False`` counts the shared maps once (distinct storages)."""
        sizes = list(numels)
        total = sum(self.parameter_bytes(n, shared_qmaps=not every_tensor) for n in sizes)
        if not every_tensor and any(n >= self.min_8bit_size for n in sizes):
            total += sum(self.qmap_bytes)
        return total


@lru_cache(maxsize=1)
def eight_bit_layout() -> EightBitLayout:
    """Read the layout from the installed library by letting ``init_state`` allocate probe states."""
    import bitsandbytes as bnb

    min_8bit_size = int(inspect.signature(bnb.optim.Adam8bit.__init__).parameters["min_8bit_size"].default)

    def init(numel: int) -> dict[str, torch.Tensor]:
        param = nn.Parameter(torch.zeros(numel))
        optimizer = bnb.optim.Adam8bit([param])
        optimizer.init_state(optimizer.param_groups[0], param, 0, 0)
        return {k: v for k, v in optimizer.state[param].items() if isinstance(v, torch.Tensor)}

    # A power-of-two size gives blocks = numel / blocksize exactly; numel + 1 confirms the rounding up.
    numel = 2**16
    state, state_plus = init(numel), init(numel + 1)
    blocks = state["absmax1"].numel()
    blocksize = numel // blocks
    if blocks * blocksize != numel or state_plus["absmax1"].numel() != math.ceil((numel + 1) / blocksize):
        raise RuntimeError(f"bitsandbytes {bnb.__version__}: unexpected block layout ({blocks} blocks for {numel})")
    probe_args = bnb.optim.Adam8bit([nn.Parameter(torch.zeros(1))]).args
    return EightBitLayout(
        version=bnb.__version__,
        min_8bit_size=min_8bit_size,
        blocksize=blocksize,
        qmap_bytes=(state["qmap1"].numel() * state["qmap1"].element_size(),
                    state["qmap2"].numel() * state["qmap2"].element_size()),
        state_itemsize=state["state1"].element_size(),
        unorm_bytes=FP32 if float(getattr(probe_args, "max_unorm", 0.0)) > 0 else 0,
    )


def adam8bit_bytes(params: Sequence[torch.Tensor], every_tensor: bool = True) -> int:
    """Expected Adam8bit / AdamW8bit state bytes after one step, for the default arguments."""
    return eight_bit_layout().total_bytes((p.numel() for p in params), every_tensor=every_tensor)


def adamw_bytes(params: Sequence[torch.Tensor]) -> int:
    """torch Adam/AdamW: exp_avg and exp_avg_sq like the parameter, plus a float32 ``step`` tensor each."""
    return sum(2 * p.numel() * p.element_size() + FP32 for p in params)


def adamw_elements(params: Sequence[torch.Tensor]) -> int:
    return sum(2 * p.numel() + 1 for p in params)


def adafactor_bytes(params: Sequence[torch.Tensor]) -> int:
    """transformers Adafactor (beta1=None): a factored second moment (row + column) for >= 2-D
    parameters, a full one otherwise, and a float32 RMS scalar; states are float32."""
    total = 0
    for p in params:
        shape = tuple(p.shape)
        if len(shape) >= 2:
            rows = math.prod(shape[:-1])
            cols = math.prod(shape[:-2]) * shape[-1]
            total += (rows + cols) * FP32
        else:
            total += p.numel() * FP32
        total += FP32  # RMS
    return total


def course_estimate_bytes(param_count: int) -> int:
    """The course's estimate for 8-bit Adam: 1 byte x 2 states per parameter."""
    return 2 * param_count
