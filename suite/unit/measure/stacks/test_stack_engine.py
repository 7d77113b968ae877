"""memclaims.measure.stacks.stack_engine's phase driver: phases opened and closed at a stack's callbacks, one at a time,
recorded in the order they ran; the engine lookup by name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from memclaims.core.errors import UsageError
from memclaims.measure.stacks import ENGINES, engine_class
from memclaims.measure.stacks.stack_engine import PhaseDriver


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


def test_the_door_finds_each_stacks_engine_and_names_an_unknown_one() -> None:
    from memclaims.techniques import technique_registry as registry

    named = {t.hooks.engine for t in registry.TECHNIQUES if getattr(t.hooks, "engine", "")}  # type: ignore[attr-defined]
    assert named == set(ENGINES)
    with pytest.raises(UsageError, match="no stack engine 'nope'; the engines: hf_trainer_engine"):
        engine_class("nope")
