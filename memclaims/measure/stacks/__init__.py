"""The engines of the training stacks that run the loop themselves (issue #42): transformers' Trainer
(``hf_trainer_engine``), Accelerate with the course's loop (``accelerate_engine``), Lightning's Trainer
(``lightning_trainer_engine``), on one device, through the one pipeline (``memclaims.measure.pipeline``).

Each expresses the recipe through its stack's own switches (the technique module's mapping:
``memclaims.techniques.hf_trainer``, ``accelerate_loop``, ``lightning_trainer``), lets the stack run its loop, and
drives the same per-phase probes from the stack's callbacks or by wrapping its calls (``stack_engine.PhaseDriver``),
in the order the stack runs them. ``memclaims.run.run_recipe`` picks the engine (``engine_class``) by the stack's
``engine`` name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.core.errors import UsageError

if TYPE_CHECKING:
    from memclaims.measure.stacks.stack_engine import StackEngine

ENGINES = ("hf_trainer_engine", "accelerate_engine", "lightning_trainer_engine")


def engine_class(name: str) -> type[StackEngine]:
    """The engine class of the module ``name`` of this package (a ``Stack``'s ``engine``); each imports its stack's
    library, so it is imported only when a recipe runs on it."""
    if name == "hf_trainer_engine":
        from memclaims.measure.stacks.hf_trainer_engine import HfTrainerEngine

        return HfTrainerEngine
    if name == "accelerate_engine":
        from memclaims.measure.stacks.accelerate_engine import AccelerateEngine

        return AccelerateEngine
    if name == "lightning_trainer_engine":
        from memclaims.measure.stacks.lightning_trainer_engine import LightningTrainerEngine

        return LightningTrainerEngine
    raise UsageError(f"no stack engine {name!r}; the engines: {', '.join(ENGINES)}")
