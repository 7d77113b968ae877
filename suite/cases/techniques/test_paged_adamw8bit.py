"""paged-adamw8bit (issue #27), bitsandbytes' PagedAdamW8bit: on the simulated GPU at the article's scale
(ViT-L/16, batch 64) its large states sit in unified memory, outside the caching allocator, against the
stored baseline; states that stay in the allocator are named by recipe, metric and phase; on the CPU
bitsandbytes does not page, and the Record says so.

The claim from bitsandbytes' documentation is suite/cases/test_claims.py's (``paged-optimizer-unified-memory``).
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from memclaims.baselines.compare import compare
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import run_recipe
from memclaims.sim import simulate
from memclaims.sim.tracker import DeviceMemory

PAGED = ("paged-adamw8bit",)


@pytest.mark.sim
def test_replay_is_active_and_matches_its_baseline(record_cache: RecordCache, baseline_check,
                                                   record_property) -> None:
    recipe = resolve("vit", "article", PAGED)
    record = record_cache.get("sim", recipe)
    assert active.problems(recipe, record) == []
    eight = record_cache.get("sim", resolve("vit", "article", ("adamw8bit",)))
    # The same states as AdamW8bit's; the large ones (uint8, 1 B per parameter each) out of the allocator.
    assert record.optimizer_state_bytes == eight.optimizer_state_bytes
    assert 0.9 * eight.optimizer_state_bytes < (record.observed("paged-adamw8bit", "paged_state_bytes") or 0) < \
        eight.optimizer_state_bytes
    assert record.peak_allocated_bytes < eight.peak_allocated_bytes
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


@pytest.mark.sim
def test_states_that_stay_in_the_allocator_are_caught(record_cache: RecordCache, monkeypatch) -> None:
    clean = record_cache.get("sim", resolve("vit", "article", PAGED))
    monkeypatch.setattr(DeviceMemory, "outside", lambda self: nullcontext())
    injected = simulate(resolve("vit", "article", PAGED))
    assert active.problems(resolve("vit", "article", PAGED), injected) == [
        "vit-article/paged-adamw8bit: paged-adamw8bit is not active: paged_state_bytes is 0 B after phase "
        "optimizer_step: no optimizer state in unified memory (bitsandbytes pages states of 100,000 elements or more)"]
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    assert comparison.failures and "phases.optimizer_step" in comparison.message()


@pytest.mark.requires(bitsandbytes="cpu")
def test_on_the_cpu_bitsandbytes_does_not_page_and_the_record_says_so() -> None:
    recipe = resolve("vit", "smoke", PAGED)
    record = run_recipe(recipe, RunOptions(device="cpu", evaluate=False, memory_steps=1))[0]
    assert record.observed("paged-adamw8bit", "paged_state_bytes") == 0 and record.optimizer_state_by_dtype.get("uint8", 0) > 0
    assert active.problems(recipe, record) == []
    assert any("Paged optimizers are not supported on CPU" in note for note in record.notes)
