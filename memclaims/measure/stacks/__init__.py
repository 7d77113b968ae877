"""The drivers of the training stacks that run the loop themselves (issue #42): transformers' Trainer
(``hf_trainer_driver``), Accelerate with the course's loop (``accelerate_driver``), Lightning's Trainer
(``lightning_trainer_driver``), each run as the pipeline's engine on one device (``memclaims.measure.pipeline``).

Each expresses the recipe through its stack's own switches (the technique module's mapping:
``memclaims.techniques.hf_trainer``, ``accelerate_loop``, ``lightning_trainer``), lets the stack run its loop, and
drives the same per-phase probes from the stack's callbacks or by wrapping its calls (``stack_driver.PhaseDriver``),
in the order the stack runs them. ``memclaims.run.run_recipe`` finds a stack's driver by the import path its
technique names (``Stack.driver``, ``driver_class``): a new stack is its technique module, its driver module here and
its line in the registry, nothing in this package's ``__init__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.core.targets import target_class

if TYPE_CHECKING:
    from memclaims.measure.stacks.stack_driver import StackDriver
    from memclaims.techniques.base import Stack


def driver_class(stack: Stack) -> type[StackDriver]:
    """The driver of ``stack`` (its ``driver``: ``"module:Class"``); each imports its stack's library, so it is
    imported only when a recipe runs on it."""
    from memclaims.measure.stacks.stack_driver import StackDriver

    return target_class(stack.driver, StackDriver)
