"""What a claim's check reads: Records of this session, by key, and the facts beside them.

A check never runs anything: it asks its ``Lookup`` for the Records it compares, and its caller
(suite/cases/test_claims.py through ``memclaims.pytest.records.RecordCache``, ``memclaims.report.reproduce``,
``memclaims.gpu.sim_preflight``) measured them through ``memclaims.run.run_recipe``. A key is the techniques of
a recipe at the claim's workload and the tier's scale (``("bf16-true",)``), or a ``Variant`` of one
(the same recipe with smaller micro-batches, or only its load as the 07 scripts replay it); every
caller turns a key into what to measure the same way: ``recipe_of`` and ``options_for``. The one fact
a check reads that no Record holds, a model's parameter shapes (the course's arithmetic), comes from
``Lookup.parameters``, which the caller also provides (``memclaims.run.model_parameters``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.recipes.run_options import RunOptions

Techniques = tuple[str, ...]


@dataclass(frozen=True)
class Variant:
    """A recipe's Record measured otherwise than the tier measures the recipe itself."""

    techniques: Techniques
    # The recipe's batch in micro-batches of this size (the accumulation steps follow): 05 at 16 x 1.
    micro_batch_size: int | None = None
    # Only its load, as the 07 scripts load the model (RunOptions.load_only: the sim's replay, the stock head).
    load_only: bool = False


Key = Techniques | Variant


def techniques_of(key: Key) -> Techniques:
    return key.techniques if isinstance(key, Variant) else key


def recipe_of(key: Key, workload: str, scale: str) -> Recipe:
    """The recipe a key names, at ``workload`` and ``scale``; a smaller micro-batch is a size knob, so
    its recipe id differs from the recipe's own (``vit-article[accum=16]/...``) and no cache confuses them."""
    recipe = resolve(workload, scale, techniques_of(key))
    if isinstance(key, Variant) and key.micro_batch_size is not None:
        recipe = resolve(workload, scale, recipe.techniques,
                         dataclasses.replace(recipe.sizes, accumulation_steps=recipe.batch_size // key.micro_batch_size))
    return recipe


def options_for(key: Key, options: RunOptions) -> RunOptions:
    """The caller's options for the tier, with what the key asks besides (the load-only replay)."""
    return dataclasses.replace(options, load_only=True) if load_only(key) else options


def load_only(key: Key) -> bool:
    """Whether the key asks for the load-only replay (another Record of the same recipe id: cache it apart)."""
    return isinstance(key, Variant) and key.load_only


@dataclass(frozen=True)
class Lookup:
    """``get(key) -> Record``, and ``get.parameters(workload, scale)``: a model's parameters (shapes, on the
    meta device). A missing Record or fact raises KeyError, which reproduce reads as "not measured"."""

    records: Callable[[Key], Record]
    parameters_of: Callable[[str, str], Sequence[object]] | None = None

    def __call__(self, key: Key) -> Record:
        return self.records(key)

    def parameters(self, workload: str, scale: str) -> Sequence[Any]:
        if self.parameters_of is None:
            raise KeyError(f"the parameters of {workload}-{scale}: this lookup has no model facts")
        return self.parameters_of(workload, scale)
