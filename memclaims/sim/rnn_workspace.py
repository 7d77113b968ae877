"""The workspace a recurrent layer's training kernel keeps for its backward pass, which fake tensors lack.

On the CPU ``nn.LSTM`` runs oneDNN's ``mkldnn_rnn_layer``, whose fourth output is a workspace (the
gates of every time step) saved for backward; its fake (meta) kernel returns it empty, so a replay
would miss it (a 2-layer bidirectional LSTM of width 32 over 12 tokens, batch 8: the replay's
peak was 0.42 of the real run's). The size is oneDNN's own: it is read by running the real kernel
once on zeros of the same shapes (cached per shape). On a GPU cuDNN keeps a reserve space of the
same role (the gates per step); the CPU's size stands in for it, as the CPU flash kernel stands
in for the GPU's attention kernels.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

RNN_LAYER = torch.ops.aten.mkldnn_rnn_layer.default
_WORKSPACE = 3  # the index of the workspace among mkldnn_rnn_layer's outputs


def _key(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_key(v) for v in value)
    return value


def _real(key: object) -> Any:
    if isinstance(key, tuple) and key[:1] == ("tensor",):
        return torch.zeros(key[1], dtype=key[2])
    if isinstance(key, tuple):
        return tuple(_real(k) for k in key)
    return key


@lru_cache(maxsize=64)
def _workspace_bytes(key: tuple[object, ...]) -> int:
    # Not under no_grad: the kernel makes its workspace only where autograd could need it.
    with _disable_current_modes():
        out = RNN_LAYER(*_real(key))
    nbytes: int = out[_WORKSPACE].untyped_storage().nbytes()
    return nbytes


def with_workspace(args: Any, out: Any) -> object:
    """``mkldnn_rnn_layer``'s fake outputs with a workspace of the real kernel's size (made in the
    running fake mode, so that it lives, and is counted, as long as autograd keeps it). ``new_empty`` on
    a fake output, not ``torch.empty``: this runs inside the fake mode's own dispatch, where the mode is
    off and a factory function would make a real tensor."""
    size = _workspace_bytes(_key(tuple(args)))
    empty = out[_WORKSPACE]
    if empty.untyped_storage().nbytes() >= size:
        return out
    workspace = empty.new_empty(size // empty.element_size())
    return (*out[:_WORKSPACE], workspace, *out[_WORKSPACE + 1:])
