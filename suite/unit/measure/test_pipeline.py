"""memclaims/measure/pipeline.py's one decision of the accuracy phase per run: the optimizer's schedule covers every
step the run takes (the Record snapshots, scripts/records-snapshot, hold the rest of the pipeline)."""

from __future__ import annotations

import pytest

from memclaims.core.names import GPU_SMOKE
from memclaims.measure.pipeline import Engine, scheduled_steps
from memclaims.recipes import run_options
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions

STEPS_PER_EPOCH, MEMORY_STEPS = 40, 3


@pytest.mark.parametrize(("scale", "options", "expected"), [
    ("smoke", RunOptions(evaluate=False), STEPS_PER_EPOCH),  # no accuracy phase: the measured steps' epoch
    ("smoke", RunOptions(), STEPS_PER_EPOCH),  # the scale's one epoch
    ("smoke", RunOptions(accuracy_epochs=3), 3 * STEPS_PER_EPOCH),
    (GPU_SMOKE, RunOptions(), None),  # a budget of steps: after the measured ones
    (GPU_SMOKE, RunOptions(accuracy_full_epochs=True), STEPS_PER_EPOCH),
])
def test_the_schedule_covers_every_step_the_run_takes(scale: str, options: RunOptions, expected: int | None) -> None:
    recipe = resolve("vit", scale, ("fabric",))
    engine = Engine(recipe, options)
    if expected is None:
        assert engine.accuracy_schedule["kind"] == "steps"
        expected = recipe.scale.accuracy_steps + MEMORY_STEPS
    assert scheduled_steps(engine, STEPS_PER_EPOCH, MEMORY_STEPS) == expected


def test_the_accuracy_phase_is_decided_once_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine asks run_options once for whether it evaluates and what the phase runs; the optimizer's schedule,
    the test set and the Record read its answer."""
    asked = {"evaluates": 0, "accuracy_schedule": 0}
    for name in asked:
        real = getattr(run_options, name)
        monkeypatch.setattr("memclaims.measure.pipeline." + name,
                            lambda *a, _real=real, _name=name: asked.__setitem__(_name, asked[_name] + 1) or _real(*a))
    engine = Engine(resolve("vit", "smoke", ("fabric",)), RunOptions())
    for _ in range(3):
        scheduled_steps(engine, STEPS_PER_EPOCH, MEMORY_STEPS)
    assert asked == {"evaluates": 1, "accuracy_schedule": 1}
