"""paged-adamw8bit: bitsandbytes' PagedAdamW8bit, AdamW8bit whose large states live in CUDA unified memory,
paged to the host when the GPU runs out (on the CPU: unpaged, as bitsandbytes falls back).

The optimizer is the recipe's core field (``optimizer="paged_adamw8bit"``, built by
``memclaims.measure.optimizers``); this module owns what only paging shows: the state bytes in unified memory
(the Record's ``paged_state_bytes``, outside the caching allocator's figures) and their check.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from memclaims.core.optimizer_choices import PAGED_MIN_NUMEL
from memclaims.techniques.base import Hooks, Observed, Say, Technique, observations

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimSession

NAME = "paged-adamw8bit"  # the technique's registry name, and its part of the Record (``by_technique``)


def state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[Any]:
    """The optimizer's state tensors (``memclaims.measure.tensors.optimizer_state_tensors``' walk)."""
    import torch

    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def paged_state_bytes(states: Iterable[Any]) -> int:
    """Bytes of the optimizer state tensors bitsandbytes allocated in unified memory (``is_paged``)."""
    return sum(t.untyped_storage().nbytes() for t in states if getattr(t, "is_paged", False))


class PagedAdamW8bit(Hooks):
    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        paged = paged_state_bytes(state_tensors(optimizer))
        if not paged:
            engine.notes.append(f"{engine.recipe.optimizer}: no optimizer state in unified memory on "
                                f"{engine.options.device} (bitsandbytes pages the states of CUDA parameters only: "
                                "'Paged optimizers are not supported on CPU. Falling back to non-paged optimizer "
                                "behavior.')")
        return observations(NAME, paged_state_bytes=paged)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        paged = record.observed(NAME, "paged_state_bytes")
        if record.device != "cpu" and not paged:
            say(f"paged_state_bytes is {paged} B after phase optimizer_step: no optimizer state in "
                f"unified memory (bitsandbytes pages states of {PAGED_MIN_NUMEL:,} elements or more)")

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        # Unified memory: the state tensors the device does not hold.
        return observations(NAME, paged_state_bytes=session.memory.host_bytes(state_tensors(optimizer)))


ENTRY = Technique(NAME, "bitsandbytes PagedAdamW8bit: AdamW8bit whose large states live in CUDA unified "
                  "memory, paged to the host when the GPU runs out (on the CPU: unpaged, as bitsandbytes falls back)",
                  "bitsandbytes docs: paged optimizers", group="optimizer", optimizer="paged_adamw8bit",
                  requires=frozenset({"bitsandbytes"}), in_cover=False, in_default=False, computes_as="adamw8bit",
                  hooks=PagedAdamW8bit())
