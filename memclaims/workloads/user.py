"""Workloads from the user's own code: the technique matrix, claims and baselines for their model.

A workload factory is a zero-argument callable returning a ``memclaims.workloads.vit.Workload``;
``define`` builds one from a model builder, data sets and the block class that FSDP and activation
checkpointing wrap. Factories are found, in this order:

- the entry-point group ``memclaims.workloads.vit`` of installed packages (``name = "pkg.mod:factory"``);
- ``register_spec("pkg.mod:factory")``, which the pytest plugin calls for each line of the ini
  option ``memclaims_workloads`` and the CLI for each item of ``$MEMCLAIMS_WORKLOADS``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from importlib import metadata
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from memclaims.core.errors import UsageError
from memclaims.core.names import BUILT_IN_WORKLOADS
from memclaims.workloads import data
from memclaims.workloads.batch_shapes import BatchShapes
from memclaims.workloads.types import LoraTargets, Scale, Workload

ENTRY_POINT_GROUP = "memclaims.workloads.vit"
ENV = "MEMCLAIMS_WORKLOADS"  # comma-separated "pkg.mod:factory" specs, for the CLI

_registered: dict[str, Workload] = {}
_env_specs_loaded: set[str] = set()


def define(name: str, *, build_model: Callable[[Scale], nn.Module], train_data: Callable[[Scale], Dataset[object]],
           test_data: Callable[[Scale], Dataset[object]], block_class: type[nn.Module], num_classes: int,
           smoke_batch_size: int = 16, article_batch_size: int = 64, learning_rate: float = 1e-3,
           summary: str = "", collate_fn: Callable[[list[Any]], Any] | None = None,
           fsdp_auto_wrap: bool = True, memory_steps: int = 3, accuracy_epochs: int = 1,
           lora: Mapping[str, object] | None = None, tensor_parallel_plan: Mapping[str, str] | None = None) -> Workload:
    """A workload from the pieces a user has: ``build_model(scale)`` returns a randomly initialised
    (or loaded) model whose ``forward(inputs)`` gives (N, num_classes) logits; the data callables
    return map-style datasets of (inputs, label). ``scale.name`` is ``smoke`` (the CPU tier) or
    ``article`` (full size: the gpu tier and the sim). The sim (``--device sim``, ``memclaims fit``)
    builds the same model on fake tensors and shapes its batches from the first batch of
    ``train_data(scale)``: it needs nothing more.

    ``lora``: where ``-t lora`` and ``-t qlora`` put peft's adapters on this model and with what, by peft's
    ``LoraConfig`` names: ``target_modules`` (required: module names, matched as suffixes), ``modules_to_save``
    (trained in full beside them, e.g. the head), ``r``, ``lora_alpha``, ``lora_dropout`` (this workload's defaults;
    ``--lora-r`` and the rest ask others). None: the workload takes neither technique.
    ``tensor_parallel_plan``: how ``-t tensor-parallel`` splits the model's ``nn.Linear`` layers over the ranks, in
    transformers' ``base_model_tp_plan`` format: a module name (``*`` for any one part, e.g. ``blocks.*.mlp.0``) ->
    ``"colwise"`` or ``"rowwise"``. None: the workload does not take it."""
    if not name or any(c in name for c in "/[]+ ") or name.startswith("hf:"):
        raise UsageError(f"workload name {name!r} may not be empty, start with 'hf:' or hold '/', '[', ']', '+' "
                         "or spaces (it is part of every recipe id)")

    def scale(scale_name: str, batch: int) -> Scale:
        return Scale(scale_name, f"{name}, batch {batch}", batch_size=batch, learning_rate=learning_rate,
                     sgd_learning_rate=learning_rate * 10, memory_steps=memory_steps,
                     accuracy_epochs=accuracy_epochs)

    def load(scale: Scale, data_dir: object) -> data.DataBundle:

        return data.TextBundle(name=f"{name} (user data)", train=train_data(scale), test=test_data(scale),
                          collate_fn=collate_fn)

    return Workload(
        name=name, summary=summary or f"user workload {name}", source="user code", num_classes=num_classes,
        scales={"smoke": scale("smoke", smoke_batch_size), "article": scale("article", article_batch_size)},
        build_model=lambda s: (build_model(s), "random"),
        load_data=load, block_class=lambda: block_class, fsdp_auto_wrap=fsdp_auto_wrap,
        # The sim builds the same model on fake tensors (its head is the user's: num_classes is
        # theirs already) and shapes its fake batches from one real batch of the training data.
        architecture=lambda s, _classes: build_model(s),
        fake_inputs=BatchShapes(name, train_data, collate_fn),
        lora_targets=None if lora is None else _lora_targets(name, lora),
        tensor_parallel_plan=None if tensor_parallel_plan is None else _plan(name, tensor_parallel_plan),
    )


_LORA_KEYS = ("target_modules", "modules_to_save", "r", "lora_alpha", "lora_dropout")


def _names(name: str, key: str, value: Any) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"define({name!r}, lora=...): {key} {value!r} is not a list of module names")
    return names


def _lora_targets(name: str, lora: Mapping[str, Any]) -> LoraTargets:
    """``define``'s ``lora`` as the workload's ``LoraTargets`` (its values are checked where a recipe uses them:
    ``memclaims.techniques.lora.effective``)."""
    unknown = sorted(set(lora) - set(_LORA_KEYS))
    if unknown:
        raise UsageError(f"define({name!r}, lora=...): unknown key {', '.join(unknown)}; it takes peft's LoraConfig "
                         f"names {', '.join(_LORA_KEYS)}")
    if "target_modules" not in lora:
        raise UsageError(f"define({name!r}, lora=...) needs target_modules: the names of the modules that get "
                         "adapters (peft has no default for a model of your own)")
    return LoraTargets(_names(name, "target_modules", lora["target_modules"]),
                       _names(name, "modules_to_save", lora["modules_to_save"]) if lora.get("modules_to_save") else (),
                       r=lora.get("r"), lora_alpha=lora.get("lora_alpha"), lora_dropout=lora.get("lora_dropout"))


def _plan(name: str, plan: Mapping[str, str]) -> dict[str, str]:
    """``define``'s ``tensor_parallel_plan``, its styles checked (its module names are checked against the model
    where a recipe splits it: ``memclaims.techniques.impl.tensor_parallel_plan.layout``)."""
    if not plan:
        raise UsageError(f"define({name!r}, tensor_parallel_plan=...) is empty: name the nn.Linear layers to split")
    for pattern, style in plan.items():
        if style not in ("colwise", "rowwise"):
            raise UsageError(f"define({name!r}, tensor_parallel_plan=...): {pattern} -> {style!r}; the styles are "
                             "'colwise' and 'rowwise' (torch's ColwiseParallel and RowwiseParallel)")
    return dict(plan)


def _load(spec: str) -> Workload:
    module_name, sep, attribute = spec.strip().partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"workload factory {spec!r} is malformed; expected package.module:factory")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise UsageError(f"workload factory {spec!r} cannot be loaded: {type(error).__name__}: {error}") from None
    made = factory()
    if not isinstance(made, Workload):
        raise UsageError(f"workload factory {spec!r} returned {type(made).__name__}, not a memclaims Workload "
                         "(build one with memclaims.workloads.user.define)")
    return made


def register(made: Workload) -> Workload:
    if made.name in BUILT_IN_WORKLOADS:
        raise UsageError(f"user workload {made.name!r} has the name of a built-in workload; "
                         f"built-in names: {', '.join(BUILT_IN_WORKLOADS)}")
    _registered[made.name] = made
    return made


def register_spec(spec: str) -> Workload:
    """Load ``package.module:factory`` and register the workload it returns."""
    return register(_load(spec))


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _from_env() -> None:
    for spec in filter(None, (s.strip() for s in os.environ.get(ENV, "").split(","))):
        if spec not in _env_specs_loaded:
            _env_specs_loaded.add(spec)
            register_spec(spec)


def find(name: str) -> Workload | None:
    """The user workload ``name``, loading its entry point on first use; None when there is none."""
    _from_env()
    if name not in _registered and name in _entry_points():
        made = _load(_entry_points()[name])
        if made.name != name:
            raise UsageError(f"entry point {name!r} of group {ENTRY_POINT_GROUP} returned workload {made.name!r}; "
                             "the entry point's name must be the workload's")
        register(made)
    return _registered.get(name)


def names() -> list[str]:
    _from_env()
    return list(dict.fromkeys([*_registered, *_entry_points()]))


def forget(name: str) -> None:
    """Unregister (for tests that register a workload of their own)."""
    _registered.pop(name, None)
