"""Building any model on the sim's fake tensors: what ``nn`` modules do while they construct themselves.

- ``copy.deepcopy``: ``nn.Transformer``, ``TransformerEncoder`` and ``TransformerDecoder`` clone
  their layer with ``_get_clones``. ``Tensor.__deepcopy__`` of a fake tensor copies its storage
  outside the fake mode and wraps it in a *new* ``FakeTensorMode``; the first op on it then fails
  (``AssertionError: Mixing fake modes NYI``, from ``xavier_uniform_`` in
  ``nn.Transformer._reset_parameters``). ``same_mode_copies`` makes the copy a ``clone`` in the
  session's mode instead: one new storage per tensor, counted where a GPU run would allocate it.
- a model that cannot be built on fake tensors (user code reading a value, a kernel without a fake
  implementation): ``naming_the_module`` turns the error into one line naming the module whose
  constructor failed and why.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from memclaims.core.errors import MemclaimsError, UsageError


class _SameModeCopy(TorchFunctionMode):
    """``Tensor.__deepcopy__`` as ``detach().clone()`` in the mode that made the tensor, keeping
    what a deep copy keeps (parameter-ness, ``requires_grad``, the memo that shares tied tensors)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> object:
        if func is not torch.Tensor.__deepcopy__:
            return func(*args, **(kwargs or {}))
        tensor, memo = args
        if id(tensor) in memo:
            return memo[id(tensor)]
        with torch.no_grad():
            copied = tensor.detach().clone()
        if isinstance(tensor, nn.Parameter) or getattr(tensor, "_is_param", False):
            copied = nn.Parameter(copied, requires_grad=tensor.requires_grad)
        else:
            copied.requires_grad_(tensor.requires_grad)
        memo[id(tensor)] = copied
        return copied


def same_mode_copies() -> TorchFunctionMode:
    """A torch-function mode under which deep copies of fake tensors stay in their fake mode."""
    return _SameModeCopy()


def _failing_module(error: BaseException) -> str:
    """The innermost ``nn.Module`` whose method was running when ``error`` was raised, as
    ``ClassName (file:line)``, or the innermost frame outside torch when no module was."""
    frames = traceback.extract_tb(error.__traceback__)
    module = None
    tb = error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module):
            module = type(owner)
        tb = tb.tb_next
    outside = [f for f in frames if "/torch/" not in f.filename and "/memclaims/sim/" not in f.filename]
    where = f"{outside[-1].filename}:{outside[-1].lineno}" if outside else f"{frames[-1].filename}:{frames[-1].lineno}"
    return f"{module.__module__}.{module.__qualname__} ({where})" if module else where


@contextmanager
def naming_the_module(workload: str) -> Iterator[None]:
    """Build ``workload``'s model; an error other than memclaims' own becomes a UsageError naming the module."""
    try:
        yield
    except MemclaimsError:
        raise
    except Exception as error:  # whatever the user's constructor or a fake kernel raised
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        raise UsageError(
            f"the sim cannot build workload {workload!r} on fake tensors: {_failing_module(error)} raised "
            f"{type(error).__name__}: {first_line} (a model the sim builds may not read tensor values while it "
            "is constructed; run it on --device cpu or cuda instead)") from None
