"""The replays of ``memclaims.core.library_eras``' eras: the installed libraries' code, made to allocate as an older
release did, for the length of a replay (``replaying``, around ``memclaims.sim.replays.simulate``).

Each replay changes the one thing its era's source names and nothing else, on the installed code, as
``memclaims.sim.eras`` does for torch's 2023-06 foreach Adam; a hand-written patch, because no library keeps its old
behaviour behind a switch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, cast

from memclaims.core.library_eras import LibraryEra


@contextmanager
def matmul4bit_keeps_input() -> Iterator[None]:
    """bitsandbytes 0.39.0-0.43.1 (PR #1270, fixed in 0.43.2): ``MatMul4Bit.forward`` ended with
    ``ctx.tensors = (A, B)`` where today's has ``(None, B)``, when the input or the weight needs a gradient.
    ``ctx.tensors`` is a plain attribute of the autograd node, not ``save_for_backward``: the backward's release
    of saved tensors never drops it, so A lives until the graph does (until the loop drops its loss), and
    activation checkpointing's saved-tensor hooks never see it. Today's forward runs unchanged; A is put back."""
    from bitsandbytes.autograd._functions import MatMul4Bit

    installed = MatMul4Bit.forward
    function = cast(Any, MatMul4Bit)  # its forward is swapped for the block, then put back

    def forward(ctx: Any, A: Any, B: Any, *args: Any, **kwargs: Any) -> object:
        output = installed(ctx, A, B, *args, **kwargs)
        if not ctx.is_empty and any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])
        return output

    # autograd.Function.apply looks forward up on the class at each call.
    function.forward = staticmethod(forward)
    try:
        yield
    finally:
        function.forward = staticmethod(installed)


@contextmanager
def replaying(eras: tuple[LibraryEra, ...]) -> Iterator[None]:
    """Every era of ``eras`` replayed (its ``replay``, by import path) for the duration of the block."""
    with ExitStack() as stack:
        for era in eras:
            module, _, name = era.replay.partition(":")
            replay = cast(Callable[[], AbstractContextManager[None]], getattr(importlib.import_module(module), name))
            stack.enter_context(replay())
        yield
