"""The published test accuracies at article scale on a GPU, where the data is the article's.

One case per logged accuracy memclaims can rerun as published (memclaims/claims/published_accuracy.py):
the ViT chain on CIFAR-10, DistilBERT's "after" on IMDb. What a case needs (GPUs, the article's
scale, the data set, cached pretrained weights, the article's one-epoch schedule) is data
(``Target.needs``), checked at collection: a session without it skips the case with the reason and
how to get it (``--memclaims-download``, ``--memclaims-accuracy-full-epochs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from memclaims.claims import published_accuracy
from memclaims.claims.published_accuracy import Facts, Target
from memclaims.core import machine
from memclaims.core.record import Record
from memclaims.pytest.records import RecordCache
from memclaims.recipes import requirements
from memclaims.run import run_recipe


def session_facts(config: pytest.Config) -> Facts:
    from memclaims.pytest.plugin import settings

    return Facts(cuda_devices=machine.cuda_device_count(),
                 gpu_scale=settings(config).gpu_scale, options=RecordCache(config).options("gpu"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" not in metafunc.fixturenames:
        return
    facts = session_facts(metafunc.config)
    params = []
    for target in published_accuracy.targets():
        needs = requirements.needs(cuda_devices=target.needs.cuda_devices)
        # The GPUs are the requirements' own need; what the article's comparison needs beyond them
        # (scale, data, weights, schedule) is asked only of a machine that has them.
        if facts.cuda_devices >= target.needs.cuda_devices:
            reason = published_accuracy.unmet(target, facts)
            if reason:
                needs |= requirements.Needs(unsupported=(reason,))
        marks: list[Any] = [pytest.mark.gpu, *([pytest.mark.dist] if target.needs.cuda_devices > 1 else []),
                            pytest.mark.requires(needs)]
        params.append(pytest.param(target, id=f"gpu:{target.name}", marks=marks))
    metafunc.parametrize("target", params)


def _measure(target: Target, record_cache: RecordCache) -> Record:
    """Rank 0's Record: the session's Record for one GPU (shared with the claims), every GPU for a sharded one."""
    recipe = target.recipe()
    if not recipe.distributed:
        return record_cache.get("gpu", recipe)
    options = dataclasses.replace(record_cache.options("gpu"), devices=target.needs.cuda_devices, timeout_s=None)
    return run_recipe(recipe, options)[0]


def test_published_accuracy(target: Target, record_cache: RecordCache, record_property: Any) -> None:
    verdict = published_accuracy.judge(target, _measure(target, record_cache))
    record_property("detail", verdict.detail)
    assert verdict.passed, verdict.detail
