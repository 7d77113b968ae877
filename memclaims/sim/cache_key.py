"""FakeTensorMode's dispatch-cache key, built the same but faster for the arguments the sim passes.

Every op the sim replays is served from ``FakeTensorMode``'s process-wide dispatch cache, and building its key
was a third of a replay's CPU time (cProfile of the 7B QLoRA replay, torch 2.14): for each fake tensor argument
torch makes a ``TensorMetadata`` dataclass and flattens it field by field through ``dataclasses.fields`` and a
recursive ``_prep_args_for_hash`` per shape and stride. ``prep_args_for_hash`` appends the very same values, in
the same order, for the common case (fake tensors of this mode with plain int sizes, Python scalars, dtypes,
devices, lists and tuples of them) and hands any other call to torch's own code, whole. The key is the same list,
so every lookup finds the entry torch's key would: no output of the fake mode changes (the sim's records snapshot
is equal to the byte). torch has no faster key to ask for; written by hand, checked against torch's key for every
op of a replay in ``suite/unit/sim/test_cache_key.py``.

The fast path is used only while ``TensorMetadata`` has the fields it was written for (checked once, at import):
a torch release that changes them gets torch's own key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor, TensorMetadata, _BypassDispatchCache
from torch._subclasses.meta_utils import is_sparse_any

# TensorMetadata's fields, in the order torch flattens them (torch 2.4 to 2.14 at least).
_FIELDS = ("dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset", "storage_bytes",
           "requires_grad", "is_quantized", "is_conj", "is_neg", "is_inference", "is_sparse", "is_coalesced",
           "dense_dim", "sparse_dim")
SUPPORTED = tuple(field.name for field in dataclasses.fields(TensorMetadata)) == _FIELDS

# Arguments torch's key appends as (type, value): what its last ``else`` branch takes.
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_SEQUENCES = frozenset({list, tuple, torch.Size})

Prep = Callable[[list[object], Any, Any, list[object]], None]


def _append_ints(result: list[object], values: tuple[int, ...]) -> None:
    """A shape or stride as torch's recursive ``_prep_args_for_hash`` appends it: its type, its length, then
    (type, value) per element."""
    result.append(type(values))
    result.append(f"length_{len(values)}")
    for value in values:
        result.append(type(value))
        result.append(value)


def _append_tensor(mode: Any, result: list[object], tensor: Any) -> None:
    """``extract_tensor_metadata(tensor)._flatten_into(result, ...)`` for a dense tensor of plain int sizes, with
    torch's own refusals (which make the op bypass the cache)."""
    if not mode.is_our_fake(tensor):
        raise _BypassDispatchCache("not our fake")
    if tensor.constant is not None:
        raise _BypassDispatchCache("constant attribute")
    layout = tensor.layout  # FakeTensor's: torch._mkldnn for an mkldnn tensor, so strided is neither it nor sparse
    if layout is not torch.strided:
        if is_sparse_any(tensor):
            raise _BypassDispatchCache(f"{layout} tensor")
        if tensor.is_mkldnn:
            raise _BypassDispatchCache("mkldnn tensor")
    shape, stride = tensor.shape, tensor.stride() if layout == torch.strided else ()
    # suggest_memory_format: channels-last only for 4 or 5 dimensions (are_strides_like_channels_last_or_false)
    memory_format: torch.memory_format | None = (suggest_memory_format(tensor) if len(shape) in (4, 5)
                                                 else torch.contiguous_format)
    if not tensor.is_contiguous(memory_format=memory_format):
        memory_format = None
    result.append(tensor.dtype)
    _append_ints(result, shape)
    _append_ints(result, stride)
    result.append(tensor.device)
    result.append(layout)
    result.append(memory_format)
    result.append(tensor.storage_offset())
    result.append(tensor.untyped_storage().nbytes())
    result.append(tensor.requires_grad)
    result.append(tensor.is_quantized)
    result.append(tensor.is_conj())
    result.append(tensor.is_neg())
    result.append(tensor.is_inference())
    result.append(tensor.is_sparse)
    result.extend((None, None, None))  # is_coalesced, dense_dim, sparse_dim: sparse tensors only


def prep_args_for_hash(mode: Any, torch_prep: Prep, result: list[object], args: Any, state: Any,
                       id_hashed_objects: list[object]) -> None:
    """``FakeTensorMode._prep_args_for_hash(result, args, state, id_hashed_objects)``, the same values appended;
    ``torch_prep`` is torch's own, which takes any call the fast path does not cover."""
    if (type(args) not in _SEQUENCES and isinstance(args, (list, tuple, dict))) or not _known(args):
        torch_prep(result, args, state, id_hashed_objects)
        return
    _append_known(mode, result, args)


def _known(args: Any) -> bool:
    """Whether every argument is one the fast path appends exactly as torch would (else torch's code runs): scalars,
    plain lists and tuples of them, and fake tensors of plain int sizes."""
    for arg in args:
        kind = type(arg)
        if kind in _SCALARS:
            continue
        if kind in _SEQUENCES:
            if not _known(arg):
                return False
        elif not isinstance(arg, FakeTensor) or arg._has_symbolic_sizes_strides:
            return False
    return True


def _append_known(mode: Any, result: list[object], args: Any) -> None:
    if type(args) in _SEQUENCES:
        result.append(type(args))
        result.append(f"length_{len(args)}")
    for arg in args:
        kind = type(arg)
        if kind in _SCALARS:
            result.append(kind)
            result.append(arg)
        elif kind in _SEQUENCES:
            _append_known(mode, result, arg)
        else:
            _append_tensor(mode, result, arg)
