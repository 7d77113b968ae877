"""expandable-segments (issue #27), the CUDA caching allocator's setting: on the simulated GPU at the
article's scale (ViT-L/16, batch 64), active and against its baseline, with less of the reserved memory
left unused than the default allocator; a setting that does not take is named by recipe, metric and
phase; and the CUDA calls, against a fake (no GPU here).

The claim from PyTorch's documentation is suite/cases/test_claims.py's (``expandable-segments-fewer-slivers``).
"""

from __future__ import annotations

from typing import Any

import pytest

from memclaims.baselines.compare import compare
from memclaims.core.errors import UsageError
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions, evaluates
from memclaims.run import run_recipe
from memclaims.sim import replays, simulate
from memclaims.techniques.impl import cuda_allocator_setting as allocator_setting

EXPANDABLE = ("expandable-segments",)


@pytest.mark.sim
def test_replay_is_active_and_matches_its_baseline(record_cache: RecordCache, baseline_check,
                                                   record_property) -> None:
    recipe = resolve("vit", "article", EXPANDABLE)
    record = record_cache.get("sim", recipe)
    assert active.problems(recipe, record) == []
    assert record.observed("expandable-segments", "expandable_segment_bytes") == record.peak_reserved_total_bytes  # every segment is expandable
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


@pytest.mark.sim
def test_less_reserved_memory_is_left_unused(record_cache: RecordCache) -> None:
    """The default allocator rounds a large request up to its own segment and keeps a rest of 1 MiB or
    less unsplit; the expandable segment maps pages as needed and splits any rest."""
    default = record_cache.get("sim", resolve("vit", "article", ("fabric",)))
    grown = record_cache.get("sim", resolve("vit", "article", EXPANDABLE))
    unused = {name: r.peak_reserved_total_bytes - r.peak_allocated_bytes for name, r in
              (("default", default), ("expandable", grown))}
    assert unused["expandable"] < unused["default"], unused
    assert grown.peak_reserved_total_bytes < default.peak_reserved_total_bytes


@pytest.mark.sim
def test_a_setting_that_does_not_take_is_caught(record_cache: RecordCache, monkeypatch) -> None:
    """The setting applies to segments made after it: a replay whose allocator kept the default."""
    clean = record_cache.get("sim", resolve("vit", "article", EXPANDABLE))
    monkeypatch.setattr(replays, "with_allocator_settings", lambda chosen, recipe: chosen)
    injected = simulate(resolve("vit", "article", EXPANDABLE))
    problems = active.problems(resolve("vit", "article", EXPANDABLE), injected)
    assert problems == ["vit-article/expandable-segments: expandable-segments is not active: expandable_segment_bytes "
                        "is 0 B after phase train: no segment of the run was expandable (the allocator made a "
                        "segment per request as by default)"]
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    assert comparison.failures and "peak_reserved_total_bytes" in comparison.message()


def test_an_allocator_setting_trains_no_accuracy_phase_of_its_own() -> None:
    assert not evaluates(resolve("vit", "smoke", EXPANDABLE), RunOptions())
    # Paging moves AdamW8bit's states, not its arithmetic; with expandable segments, still AdamW8bit's.
    assert not evaluates(resolve("vit", "smoke", ("paged-adamw8bit", "expandable-segments")), RunOptions())
    assert evaluates(resolve("vit", "smoke", ("bf16-true", "expandable-segments")), RunOptions())
    assert evaluates(resolve("vit", "smoke", ("fabric",)), RunOptions())


def test_the_cpu_has_no_caching_allocator_to_set() -> None:
    with pytest.raises(UsageError, match="expandable-segments is a setting of the CUDA caching allocator, which the "
                                         "CPU has none of; run it with --device cuda, or --device sim"):
        run_recipe(resolve("vit", "smoke", EXPANDABLE), RunOptions(device="cpu"))


class FakeCuda:
    """The calls the setting makes, and a snapshot of two segments."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.memory = self

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def _set_allocator_settings(self, setting: str) -> None:
        self.calls.append(setting)

    def memory_snapshot(self) -> list[dict[str, Any]]:
        return [{"total_size": 40 << 20, "is_expandable": True}, {"total_size": 2 << 20, "is_expandable": False}]


@pytest.mark.parametrize(("environment", "restored"), [("", "expandable_segments:False"),
                                                       ("expandable_segments:True", "expandable_segments:True")])
def test_the_setting_applies_to_the_run_only(monkeypatch, environment: str, restored: str) -> None:
    """Cached segments go before (they keep their kind) and after; the environment's choice comes back."""
    monkeypatch.setenv(allocator_setting.ENV, environment)
    cuda = FakeCuda()
    with allocator_setting.expandable_segments(True, cuda):
        cuda.calls.append("run")
    assert cuda.calls == ["synchronize", "empty_cache", "expandable_segments:True", "run",
                          "synchronize", "empty_cache", restored]
    untouched = FakeCuda()
    with allocator_setting.expandable_segments(False, untouched):
        pass
    assert untouched.calls == []
    assert allocator_setting.expandable_segment_bytes(cuda) == 40 << 20
