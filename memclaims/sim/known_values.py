"""Values the sim can know on fake tensors, and the one line naming a value it cannot.

A fake tensor has a shape and a dtype but no data, so code that reads a value (``.item()``, ``bool(t)``,
``if (mask == causal).all():``, ``nonzero``) raises ``DataDependentOutputException`` under the fake mode.
Some of those values are not data at all: ``nn.TransformerDecoder.forward`` checks whether its mask is
causal (``torch.nn.modules.transformer._detect_is_causal_mask``: ``bool((mask == causal).all())``), and the
mask and the comparison are both built from constants (``torch.triu(torch.full((L, L), -inf), 1)``), as
in Lightning's demo Transformer. Such a value is the same in every run, so the sim computes it:

- a factory function with no tensor input and defined values (``FACTORIES``: ``torch.zeros``, ``ones``,
  ``full``, ``arange``, ``eye``, ...; never ``empty``, whose values are undefined) makes a small
  real tensor (at most ``KNOWN_NUMEL_LIMIT`` elements) as well as its fake one, the fake tensor's
  ``constant`` (what ``torch.tensor(3.0)`` already gets from FakeTensorMode, whose own limit is one element);
- FakeTensorMode then propagates constants itself: an op whose tensor inputs all carry one runs for real
  on them and its output carries the result, and an op that writes into a constant with an input that
  has none (``add_`` of a gradient, ``normal_``) drops the constant and every alias of it
  (``FakeTensorConverter.invalidate_constant_aliases``). Reading a constant's value returns it.

The fake tensors (what the allocator model counts) are the same either way: a constant's fake tensor has
the shape, dtype and strides the real op gave. Only the training phase knows values: the model is built
and loaded without (a parameter's ``.data`` is replaced by the replay's moves, which a constant would not
follow), and a batch is data, made with values unknown (a mask of ones read as "no padding" would be a
guess about the data). What stays unknown, a value computed from data or parameters, is named in one line
(``reading_values``): the op, the module that read it and where, and what to do.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_leaves

from memclaims.core.errors import UsageError

aten = torch.ops.aten

# The largest constant a factory makes (elements): a causal mask of 4,096 positions (64 MiB in fp32,
# real host memory while the tensor lives). A larger tensor stays fake, its values unknown.
KNOWN_NUMEL_LIMIT = 4096 * 4096

# Factory overloads whose values follow from their arguments alone (sizes, fill values, ranges).
FACTORIES = frozenset({
    aten.zeros.default, aten.ones.default, aten.full.default, aten.scalar_tensor.default,
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.eye.default, aten.eye.m,
    aten.linspace.default, aten.logspace.default, aten.tril_indices.default, aten.triu_indices.default,
})


def small_enough(tensor: torch.Tensor) -> bool:
    """Whether a real result may become a fake tensor's constant in the training phase (FakeTensorMode's
    own rule, elsewhere: one element at most): a dense CPU tensor of ``KNOWN_NUMEL_LIMIT`` elements at most."""
    return tensor.numel() <= KNOWN_NUMEL_LIMIT and tensor.layout == torch.strided and tensor.device.type == "cpu"


def known_factory(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``func``'s fake result carrying its real values as its constant, for a factory of ``FACTORIES``
    that takes no tensor and makes a small CPU tensor; None otherwise (the fake mode runs it as ever)."""
    if func not in FACTORIES or any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves((args, kwargs))):
        return None
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return None
    with no_dispatch():  # real compute, as FakeTensorMode's own constant propagation does it
        real = func(*args, **kwargs)
    if not small_enough(real):
        return None
    made: torch.Tensor = mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)
    return made


_WHAT_READS = {
    "_local_scalar_dense": ".item(), bool(), int() or an if on a tensor",
    "nonzero": "nonzero(), boolean-mask indexing or torch.where with one argument",
}


def _module_path(error: BaseException, model: nn.Module) -> str:
    """The innermost module of ``model`` that was running when ``error`` was raised, as its path
    (``transformer.decoder.layers.0``, the model itself ``(model)``) and class, and the innermost line
    outside torch and memclaims' sim (the user's code, or the library module that read the value)."""
    names = {id(module): name for name, module in model.named_modules()}
    innermost = None
    tb = error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            innermost = owner
        tb = tb.tb_next
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "/torch/_" not in f.filename and "/torch/utils/" not in f.filename and "/memclaims/" not in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if innermost is None:
        return f"outside the model's modules{where}"
    path = names[id(innermost)] or "(model)"
    return f"module {path} ({type(innermost).__module__}.{type(innermost).__qualname__}){where}"


@contextmanager
def reading_values(workload: str, model: nn.Module) -> Iterator[None]:
    """Train ``workload``'s ``model``; a value the sim cannot know becomes one UsageError line: the op,
    the module path, where, and what to do."""
    try:
        yield
    except (DataDependentOutputException, DynamicOutputShapeException) as error:
        func = getattr(error, "func", None)
        op = str(func) if func is not None else type(error).__name__
        how = next((words for key, words in _WHAT_READS.items() if key in op), "a value of a tensor")
        raise UsageError(
            f"the sim cannot replay workload {workload!r}: {_module_path(error, model)} reads a tensor's value "
            f"({op}: {how}) that fake tensors do not have, computed from data or parameters (values made only "
            "from constants, torch.ones/full/arange and ops on them, are known); pass what it decides as a Python "
            "value (e.g. is_causal=True / tgt_is_causal=True for a causal mask) or run it with --device cpu or cuda"
        ) from None
