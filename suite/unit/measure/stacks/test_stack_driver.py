"""memclaims.measure.stacks.stack_driver's phase driver: phases opened and closed at a stack's callbacks, one at a time,
recorded in the order they ran; the engine lookup by name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from memclaims.core.errors import UsageError
from memclaims.measure.stacks import driver_class
from memclaims.measure.stacks.stack_driver import PhaseDriver


def test_a_phase_opened_closes_the_one_before_and_never_nests() -> None:
    events: list[str] = []

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        events.append(f"<{name}")
        yield
        events.append(f"{name}>")

    driver = PhaseDriver(phase)
    driver.open("optimizer_step")  # on_pre_optimizer_step
    driver.open("zero_grad")  # on_optimizer_step: the step's phase ends where the zeroing begins
    assert driver.current == "zero_grad"
    driver.close()  # on_step_end
    driver.close()  # a second close is nothing
    assert events == ["<optimizer_step", "optimizer_step>", "<zero_grad", "zero_grad>"]
    assert driver.sequence == ["optimizer_step", "zero_grad"] and driver.current is None


def test_the_door_finds_each_stacks_driver_by_its_path_and_names_a_wrong_one() -> None:
    """Each registered stack's ``driver`` imports to a StackDriver of this package; a path that names no class, or a
    class that is no driver, is one UsageError naming the path (never a traceback)."""
    from dataclasses import dataclass

    from memclaims.measure.stacks.stack_driver import StackDriver
    from memclaims.techniques import technique_registry as registry
    from memclaims.techniques.base import Stack

    stacks = [t.hooks for t in registry.TECHNIQUES if isinstance(t.hooks, Stack)]
    assert len(stacks) == 3
    for stack in stacks:
        found = driver_class(stack)
        assert issubclass(found, StackDriver) and found.__module__.startswith("memclaims.measure.stacks.")

    @dataclass
    class Named(Stack):
        driver: str = ""

    with pytest.raises(UsageError, match="'memclaims.measure.stacks.nope:Nope' names no class that can be imported"):
        driver_class(Named("memclaims.measure.stacks.nope:Nope"))
    with pytest.raises(UsageError, match="'memclaims.measure.stacks.stack_driver:PhaseDriver' is not a StackDriver"):
        driver_class(Named("memclaims.measure.stacks.stack_driver:PhaseDriver"))
    with pytest.raises(UsageError, match="names no class: give 'package.module:Class'"):
        driver_class(Named(""))
