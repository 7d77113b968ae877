"""FSDP2 (issue #27: ``fully_shard``, Lightning's ``ModelParallelStrategy``) on the simulated GPU: ``fsdp2``
(``reshard_after_forward=True``) and ``fsdp2-no-reshard`` (False) on the article's 08 recipe (ViT-L/16, fp32,
activation checkpointing, 4 ranks), beside FSDP1's ``fsdp``. Each replay visibly at work and against its
stored baseline; the rank's shards exactly FSDP2's per-parameter dim-0 arithmetic (the one the CPU ranks
measure, ``memclaims.measure.distributed.expected_shard_bytes``); every parameter still unsharded after the
forward without the reshard, the peak above the resharding run's; and an FSDP2 run that silently loses its
setting (the reshard flag ignored, or FSDP1 replayed instead) is named by recipe, metric and phase.

The claim from fully_shard's docstring (``fsdp2-no-reshard-keeps-unsharded``) is suite/cases/test_claims.py's.
"""

from __future__ import annotations

from typing import Any

import pytest

from memclaims.baselines.compare import compare
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.measure.distributed import expected_shard_bytes
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.sim import sharded as sim_sharded
from memclaims.sim import simulate

pytestmark = pytest.mark.sim

ARTICLE_08 = ("activation-checkpointing",)
FSDP2 = ("fsdp2", "fsdp2-no-reshard")


def _get(record_cache: RecordCache, technique: str, scale: str = "article") -> Record:
    return record_cache.get("sim", resolve("vit", scale, (technique, *ARTICLE_08)))


def _problems(technique: str, record: Record) -> list[str]:
    # activation checkpointing's own check needs the Record without it; this module is about the sharding.
    recipe = resolve("vit", record.scale, (technique, *ARTICLE_08))
    return [p for p in active.problems(recipe, record) if "activation-checkpointing is not active" not in p]


def _shapes(scale: str) -> list[list[int]]:
    model, _ = resolve("vit", scale, FSDP2[:1]).workload.build_model(resolve("vit", scale, FSDP2[:1]).scale)
    return [list(p.shape) for p in model.parameters()]


@pytest.mark.parametrize("technique", FSDP2)
def test_replay_is_active_and_matches_its_baseline(technique, record_cache, baseline_check, record_property) -> None:
    record = _get(record_cache, technique)
    assert record.devices == sim_sharded.WORLD_SIZE and record.fsdp_api == "fsdp2"
    assert _problems(technique, record) == []
    record_property(f"{record.recipe} peak_allocated_gb", round(record.peak_allocated_bytes / 1e9, 3))
    baseline_check.check(f"sim:{record.baseline_key}", record, record_property)


@pytest.mark.parametrize("scale", ["smoke", pytest.param("article", marks=pytest.mark.slow)])  # article: 5 s, nightly
def test_rank_state_is_fsdp2s_per_parameter_dim0_shards(scale, record_cache) -> None:
    """Rank 0 of 4 holds ceil(d0 / 4) rows of every parameter (its own padded storage), gradients of the same
    size (views into one reduce-scatter output per group) and Adam's two moments of them: exactly the
    arithmetic the CPU ranks measure on the real fully_shard (the Adam step scalars aside, on the host here)."""
    expected = expected_shard_bytes(_shapes(scale), 4, sim_sharded.WORLD_SIZE, 0)
    for technique in FSDP2:
        record = _get(record_cache, technique, scale)
        assert record.param_bytes == expected["param_bytes"], (record.recipe, record.param_bytes, expected)
        assert record.grad_bytes == expected["grad_bytes"], (record.recipe, record.grad_bytes, expected)
        assert record.optimizer_state_bytes == 2 * expected["param_bytes"], (record.recipe, record.optimizer_state_bytes)


def test_no_reshard_keeps_every_parameter_and_peaks_higher(record_cache, record_property) -> None:
    """reshard_after_forward=False: every parameter still unsharded after the forward (the root's only with
    True), and the rank's peak above the resharding run's; FSDP1's fsdp beside them for the record."""
    fsdp1 = record_cache.get("sim", resolve("vit", "article", ("fsdp", *ARTICLE_08)))
    resharded, kept = (_get(record_cache, t) for t in FSDP2)
    for record in (fsdp1, resharded, kept):
        record_property(f"{record.recipe} peak_allocated_bytes", record.peak_allocated_bytes)
    assert kept.forward_unsharded_params == kept.param_count, kept.forward_unsharded_params
    assert resharded.forward_unsharded_params is not None and resharded.forward_unsharded_params < kept.param_count
    assert kept.peak_allocated_bytes > resharded.peak_allocated_bytes, (kept.peak_allocated_bytes,
                                                                        resharded.peak_allocated_bytes)


def test_sim_shards_equal_the_cpu_ranks_arithmetic_on_two_ranks() -> None:
    """The smoke ViT on 2 ranks (the CPU ranks' world): the replay's rank-0 shard bytes are the ones
    ``expected_shard_bytes`` gives, which suite/cases/test_sharding.py checks against the real fully_shard
    per rank (and its nightly test against the CPU ranks' Records themselves)."""
    expected = expected_shard_bytes(_shapes("smoke"), 4, 2, 0)
    for technique in FSDP2:
        record = simulate(resolve("vit", "smoke", (technique, *ARTICLE_08)), devices=2)
        assert (record.param_bytes, record.grad_bytes) == (expected["param_bytes"], expected["grad_bytes"]), record.recipe


def _fault(monkeypatch: pytest.MonkeyPatch, **forced: Any) -> None:
    """FSDP2's setting silently lost on its way to the wrapper: every wrap called with ``forced``."""
    original = sim_sharded.wrap

    def wrap(*args: Any, **kwargs: Any) -> sim_sharded.ShardedModel:
        return original(*args, **{**kwargs, **forced})

    monkeypatch.setattr(sim_sharded, "wrap", wrap)


# The faults replay the smoke ViT (0.4 s a replay: CI's budget).
FAULT_SCALE = "smoke"


@pytest.mark.parametrize("technique, forced, named", [
    # reshard_after_forward=False ignored: the blocks reshard after their forward.
    ("fsdp2-no-reshard", {"sharding": "FULL_SHARD"}, ("forward_unsharded_params", "phase forward",
                                                      "reshard_after_forward=False")),
    # reshard_after_forward=True ignored: every block kept unsharded.
    ("fsdp2", {"sharding": "SHARD_GRAD_OP"}, ("forward_unsharded_params", "phase forward",
                                              "reshard_after_forward=True")),
    # The FSDP2 replay became FSDP1 (flat parameters: fewer padding bytes, so no memory metric regresses;
    # the API it reports is what names it).
    ("fsdp2", {"fsdp2": False}, ("fsdp_api", "phase load", "'fsdp1'")),
    ("fsdp2-no-reshard", {"fsdp2": False}, ("fsdp_api", "phase load", "'fsdp1'")),
], ids=["no-reshard-ignored", "reshard-ignored", "fsdp2-as-fsdp1", "no-reshard-as-fsdp1"])
def test_an_fsdp2_run_that_loses_its_setting_is_named(technique, forced, named, monkeypatch) -> None:
    recipe = resolve("vit", FAULT_SCALE, (technique, *ARTICLE_08))
    clean = simulate(recipe)
    _fault(monkeypatch, **forced)
    injected = simulate(recipe)
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    message = "\n".join(([comparison.message()] if comparison.failures else []) + _problems(technique, injected))
    assert f"vit-{FAULT_SCALE}/{technique}+activation-checkpointing" in message, message
    assert f"{technique} is not active" in message, message
    for text in named:
        assert text in message, message
