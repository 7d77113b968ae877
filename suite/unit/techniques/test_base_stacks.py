"""The training stacks' part of memclaims.techniques.base: the loop orders (where each stack zeroes the gradients, which
phases a step runs, whether the previous gradients live through the next forward) and a stack's refusal of what it does
not express."""

from __future__ import annotations

import pytest

from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.techniques.base import (
    ZERO_AFTER_STEP,
    ZERO_AT_WINDOW_START,
    LoopOrder,
    Stack,
)

SCRIPTS, AFTER_STEP, WINDOW = LoopOrder(), LoopOrder(ZERO_AFTER_STEP), LoopOrder(ZERO_AT_WINDOW_START)
TRAINER = LoopOrder(ZERO_AFTER_STEP, clips_gradients=True, prefetches=True, keeps_output=False)


@pytest.mark.parametrize(("order", "accumulation", "phases"), [
    (SCRIPTS, 1, ["forward", "zero_grad", "backward", "optimizer_step"]),  # 01-04, 06
    (SCRIPTS, 2, ["forward", "backward", "forward", "backward", "optimizer_step", "zero_grad"]),  # 05
    (AFTER_STEP, 1, ["forward", "backward", "optimizer_step", "zero_grad"]),  # the course's Accelerate loop
    (TRAINER, 2, ["forward", "backward", "forward", "backward", "clip_grad_norm", "optimizer_step", "zero_grad"]),
    (WINDOW, 1, ["forward", "zero_grad", "backward", "optimizer_step"]),  # Lightning: as the scripts without accumulation
    (WINDOW, 2, ["forward", "zero_grad", "backward", "forward", "backward", "optimizer_step"]),  # ... but not with it
])
def test_a_step_runs_its_phases_in_the_stacks_order(order: LoopOrder, accumulation: int, phases: list[str]) -> None:
    assert order.step_phases(accumulation) == phases


@pytest.mark.parametrize(("order", "accumulation", "alive"), [
    (SCRIPTS, 1, True), (SCRIPTS, 4, False), (AFTER_STEP, 1, False), (TRAINER, 4, False), (WINDOW, 1, True),
    (WINDOW, 4, True),
])
def test_the_previous_gradients_live_through_the_next_forward_where_zeroed_after_it(
        order: LoopOrder, accumulation: int, alive: bool) -> None:
    assert order.gradients_in_forward(accumulation) is alive


def test_every_recipe_without_a_stack_of_its_own_runs_the_scripts_order() -> None:
    for techniques in (("fabric",), ("pytorch",), ("bf16-true", "grad-accum")):
        recipe = resolve("vit", "smoke", techniques)
        assert recipe.stack_hooks is None and recipe.loop_order == SCRIPTS
    assert resolve("vit", "smoke", ("pytorch",)).stack == "pytorch"
    assert resolve("vit", "smoke", ("sgd",)).stack == "fabric"


class _Narrow(Stack):
    expresses = frozenset({"bf16-mixed"})


def _recipe(techniques: tuple[str, ...]) -> Recipe:
    """A recipe whose stack is ``hf-trainer`` by name, as a Stack that expresses bf16-mixed alone judges it."""
    return resolve("distilbert-cased", "smoke", ("hf-trainer", *techniques))


def test_a_technique_registered_after_the_stack_is_refused_not_dropped() -> None:
    """Expressed in neither the stack's list nor its conflicts (a technique added later): refused up front, named."""
    stack = _Narrow()
    assert stack.unexpressed(_recipe(("bf16-mixed",))) is None
    reason = stack.unexpressed(_recipe(("grad-accum",)))
    assert reason == "'hf-trainer' does not combine with 'grad-accum': the stack expresses only bf16-mixed through its " \
                     "own switches"
    assert stack.sim_refusal(_recipe(("grad-accum",))) == reason


def _record(**by_stack: object) -> Record:
    fields = dict(recipe="r", workload="distilbert-cased", scale="smoke", techniques=["hf-trainer"], device="cpu",
                  device_name="cpu", probe="cpu-exact", precision="32-true", batch_size=32, accumulation_steps=1,
                  memory_steps=3, param_count=1, param_tensor_count=1, param_bytes=4, grad_bytes=4,
                  optimizer_state_bytes=8, load_peak_bytes=4, peak_allocated_bytes=16, peak_reserved_bytes=None,
                  accuracy=None, final_loss=None, nan_loss=False, nan_step=None, step_time_s=None, weights="random",
                  data="x", versions={})
    return Record(**fields, by_technique={"hf-trainer": dict(by_stack)})  # type: ignore[arg-type]


def test_the_stack_check_names_a_step_run_out_of_its_order() -> None:
    """Stack.check, every stack's part of its active check (the HF Trainer's here, zeroing after the step)."""
    recipe = _recipe(())
    stack, order = recipe.stack_hooks, recipe.loop_order
    assert stack is not None
    said: list[str] = []
    Stack.check(stack, recipe, _record(step_phases=order.step_phases(1), gradients_in_forward=False), None, said.append)
    assert said == []
    scripts = SCRIPTS.step_phases(1)
    Stack.check(stack, recipe, _record(step_phases=scripts, gradients_in_forward=True), None, said.append)
    assert said == [
        f"a step ran its phases in the order {scripts}, expected {order.step_phases(1)} (the stack's loop order: "
        "zero_grad after-step)",
        "the previous step's gradients were alive in phase forward, expected freed (zero_grad after-step)"]
