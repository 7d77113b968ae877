"""The technique matrix as a pytest test, for any project that uses memclaims' plugin.

A test module that imports ``test_case`` collects it, and the plugin's ``pytest_generate_tests``
parametrizes it with every (tier, combination) of the selection, on the selected workload::

    # tests/test_memclaims.py
    from memclaims.pytest.cases import test_case  # noqa: F401

An import, not a hook that adds the test by itself: the project decides whether and where the
matrix runs, its ids (``tests/test_memclaims.py::test_case[cpu:vit-smoke/bf16-true]``) work with
``-k`` and node ids as any test's, and nothing appears in a project that did not ask for it.
The plugin registers this module for assertion rewriting, so a failed ``assert`` shows its values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from memclaims.techniques.technique_registry import TRUE_HALF_PRECISIONS

if TYPE_CHECKING:
    from memclaims.pytest.baselines import BaselineCheck
    from memclaims.pytest.records import RecordCache


def test_case(tier: str, techniques: tuple[str, ...], record_cache: RecordCache,
              baseline_check: BaselineCheck, request: pytest.FixtureRequest, record_property: Any) -> None:
    """One recipe of the matrix: it ran as asked, every technique visibly at work, no per-step leak
    (on the device or the host), and its numbers within tolerance of this environment's stored baseline."""
    from memclaims.measure import active, host_steady, steady
    from memclaims.pytest.plugin import selected_workload

    # What the machine lacks (CUDA, bitsandbytes, a workload's package) and 16-mixed on the cpu tier
    # skip at collection (memclaims.run.case_needs, through the case's requires marker).
    recipe = record_cache.recipe(tier, selected_workload(request.config), techniques)
    record = record_cache.get(tier, recipe)

    # What ran is what was asked.
    assert record.recipe == recipe.id
    assert record.precision == recipe.precision
    assert record.batch_size == recipe.batch_size and record.accumulation_steps == recipe.accumulation_steps
    # Parameters are stored in the recipe's parameter dtype: 2 bytes for true half, else 4; unless a technique
    # stores some in another (qlora's 4-bit base, packed in uint8, one stored element a byte).
    bytes_per_param = 2 if recipe.precision in TRUE_HALF_PRECISIONS else 4
    expected_param_bytes = record.param_count * bytes_per_param
    for hooks in recipe.hooks:
        expected_param_bytes = hooks.expected_param_bytes(record, bytes_per_param, expected_param_bytes)
    assert record.param_bytes == expected_param_bytes
    # One gradient per parameter, same dtype, unless a technique says otherwise: none left after a backward
    # that applied and freed each (optimizer-in-backward), the trainable parameters' only (lora).
    expected_grad_bytes = record.param_bytes
    for hooks in recipe.hooks:
        expected_grad_bytes = hooks.expected_grad_bytes(record, bytes_per_param, expected_grad_bytes)
    assert record.grad_bytes == expected_grad_bytes
    # The training peak holds at least the parameters and the optimizer state.
    assert record.peak_allocated_bytes >= record.param_bytes + record.optimizer_state_bytes
    assert record.load_peak_bytes >= record.param_bytes
    if tier == "gpu":
        assert record.peak_reserved_bytes is not None and record.peak_reserved_bytes >= record.peak_allocated_bytes
    else:
        assert record.peak_reserved_bytes is None
    # 16-true may diverge (the article's claim 3, checked at article scale); nothing else may.
    if recipe.numerics_neutral:  # computes as another recipe (Technique.computes_as): no accuracy of its own
        assert not record.nan_loss, f"loss became NaN/inf at step {record.nan_step}"
        assert record.accuracy is None and record.memory_losses, "a numerics-neutral recipe trains its steps only"
    elif any(hooks.accuracy_reported_only(record) for hooks in recipe.hooks):
        # Reported, not asserted (lora on a randomly initialised base: memclaims.techniques.lora).
        record_property("accuracy", record.accuracy)
    elif recipe.precision != "16-true":
        assert not record.nan_loss, f"loss became NaN/inf at step {record.nan_step}"
        assert record.accuracy is not None and record.accuracy > 1.5 / recipe.workload.num_classes, (
            f"accuracy {record.accuracy:.3f} is no better than chance: the recipe did not learn")
    else:
        # Reported, not asserted: the article saw NaN after ~300 steps of ViT-L/16.
        record_property("nan_step", record.nan_step)
        assert record.nan_loss == (record.nan_step is not None)
        assert record.nan_loss == (record.final_loss is None)

    # Every technique visibly at work (8-bit state quantized, batch really smaller, ...), and every
    # step after the second peaking where step 2 did (no per-step leak).
    # Checkpointing shows against the same recipe without it (the forward keeps less): that
    # recipe's measured steps, from its own case when it ran in this session, else run here.
    without = {}
    for name, hooks in zip(recipe.techniques, recipe.hooks):
        if hooks.compare_without():
            plain = tuple(t for t in techniques if t != name)
            without[name] = record_cache.memory(tier, record_cache.recipe(tier, selected_workload(request.config), plain))
    inactive = active.problems(recipe, record, without)
    assert not inactive, "\n".join(inactive)
    leaked = steady.leak(record)
    assert leaked is None, leaked
    # Nor on the host beyond the measured noise; the stored baseline, a clean run of the recipe,
    # names the phase whose gain did not come back.
    host_leak = host_steady.leak(record, reference=baseline_check.reference(record))
    assert host_leak is None, host_leak

    # Then the numbers against this environment's stored baseline (memclaims.baselines.compare).
    baseline_check.check(request.node.callspec.id, record, record_property)
