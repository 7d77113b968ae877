"""The gpu tier's scales and the metric claims compare, checked without a GPU."""

from __future__ import annotations

from typing import Any

import pytest

from memclaims.claims import catalogue as claims
from memclaims.claims.figures import peak, peak_metric
from memclaims.core.names import GPU_SMOKE
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import parse_id, resolve
from memclaims.techniques import technique_registry as registry
from memclaims.workloads.registry import WORKLOADS, gpu_tier_scale

MiB = 2**20


@pytest.mark.parametrize("requested", ["smoke", "article"])
def test_every_gpu_tier_recipe_id_round_trips(requested: str) -> None:
    for name in WORKLOADS:
        scale = gpu_tier_scale(name, requested)
        for techniques in registry.default_selection():
            try:
                recipe = resolve(name, scale, techniques)
            except Exception:  # invalid at this batch size: never becomes a case
                continue
            assert parse_id(recipe.id) == recipe


def test_gpu_smoke_is_its_own_scale_where_a_workload_has_one() -> None:
    assert gpu_tier_scale("vit", "smoke") == GPU_SMOKE
    assert gpu_tier_scale("vit-h14", "smoke") == GPU_SMOKE
    assert gpu_tier_scale("vit", "article") == "article"
    assert gpu_tier_scale("distilbert", "smoke") == "smoke"  # no gpusmoke scale: the CPU smoke
    recipe = resolve("vit", GPU_SMOKE, ("fabric",))
    assert recipe.id == "vit-gpusmoke/fabric" and "-" not in GPU_SMOKE


def test_gpu_smoke_model_is_vit_b_class() -> None:
    recipe = resolve("vit", GPU_SMOKE, ("fabric",))
    model, weights = recipe.workload.build_model(recipe.scale)
    params = sum(p.numel() for p in model.parameters())
    # fp32 parameters are ~165 MiB: a bf16-vs-fp32 or Adam-state difference is ~40+ segments of 2 MiB.
    assert 40_000_000 < params < 90_000_000 and weights == "random"
    assert model.hidden_dim == 768 and model.image_size == 128


def _cuda(recipe: str, scale: str, allocated: int, reserved: int, **changes: Any):
    return fake_record(recipe, scale=scale, device="cuda", probe="cuda", peak_allocated_bytes=allocated,
                       peak_reserved_bytes=reserved, peak_reserved_total_bytes=reserved, **changes)


def test_claims_compare_reserved_at_article_scale_and_allocated_elsewhere() -> None:
    article = _cuda("vit-article/fabric", "article", 100 * MiB, 120 * MiB)
    small = _cuda("vit-gpusmoke/fabric", GPU_SMOKE, 100 * MiB, 120 * MiB)
    assert peak_metric(article) == "peak_reserved_total_bytes" and peak(article) == 120 * MiB
    assert peak_metric(small) == "peak_allocated_bytes" and peak(small) == 100 * MiB
    cpu = fake_record("vit-smoke/fabric")
    assert peak_metric(cpu) == "peak_allocated_bytes"


def test_a_difference_reserved_granularity_hides_still_shows_and_the_detail_names_the_metric() -> None:
    # Two recipes 3 MiB apart in live bytes that round to the same reserved segments.
    records = {("16-mixed",): _cuda("vit-gpusmoke/16-mixed", GPU_SMOKE, 61 * MiB, 68 * MiB),
               ("fabric",): _cuda("vit-gpusmoke/fabric", GPU_SMOKE, 64 * MiB, 68 * MiB)}
    check = claims.CLAIMS_BY_NAME["16-mixed-memory"].check
    assert check is not None
    verdict = check.run("gpu", lambda key: records[key])
    assert verdict.passed and "peak_allocated_bytes" in verdict.detail
    at_article = {k: _cuda(r.recipe.replace(GPU_SMOKE, "article"), "article", r.peak_allocated_bytes, 68 * MiB)
                  for k, r in records.items()}
    verdict = check.run("gpu", lambda key: at_article[key])
    assert not verdict.passed and "peak_reserved_total_bytes" in verdict.detail
