"""FSDP's sharding strategies (issue #27) on the simulated GPU, at the article's scale: the 08 recipe
(ViT-L/16, fp32, FSDP + activation checkpointing, 4 ranks) under FULL_SHARD (the article's ``fsdp``),
SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD (two simulated nodes of two ranks). Each replay visibly at work
and against its stored baseline; the per-rank peaks ordered as the strategies keep state; and a run whose
strategy silently falls back to another is named by recipe, metric and phase.

The claim from PyTorch's docs (``fsdp-sharding-strategies-per-rank``) is suite/cases/test_claims.py's.
"""

from __future__ import annotations

from typing import Any

import pytest

from memclaims.baselines.compare import compare
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.sim import sharded as sim_sharded
from memclaims.sim import simulate

pytestmark = pytest.mark.sim

# The article's 08 recipe with each strategy, by FSDP's ShardingStrategy name.
ARTICLE_08 = ("activation-checkpointing",)
STRATEGIES = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp-shard-grad-op", "NO_SHARD": "fsdp-no-shard",
              "HYBRID_SHARD": "fsdp-hybrid"}


def _techniques(sharding: str) -> tuple[str, ...]:
    return (STRATEGIES[sharding], *ARTICLE_08)


def _get(record_cache: RecordCache, sharding: str) -> Record:
    return record_cache.get("sim", resolve("vit", "article", _techniques(sharding)))


@pytest.mark.parametrize("sharding", list(STRATEGIES))
def test_replay_is_active_and_matches_its_baseline(sharding, record_cache, baseline_check, record_property) -> None:
    recipe = resolve("vit", "article", _techniques(sharding))
    record = _get(record_cache, sharding)
    assert record.devices == sim_sharded.WORLD_SIZE
    # activation checkpointing's own check needs the Record without it; this module is about the sharding.
    assert [p for p in active.problems(recipe, record) if "activation-checkpointing is not active" not in p] == []
    record_property(f"{record.recipe} peak_allocated_gb", round(record.peak_allocated_bytes / 1e9, 3))
    baseline_check.check(f"sim:{record.baseline_key}", record, record_property)


def test_per_rank_peak_orders_no_shard_above_shard_grad_op_above_full_shard(record_cache, record_property) -> None:
    """What a rank keeps orders the peaks: NO_SHARD the whole model, its gradients and Adam state (+3 x 1.21 GB
    over FULL_SHARD's quarter); SHARD_GRAD_OP FULL_SHARD's shards plus every block gathered from the forward
    through the backward; HYBRID_SHARD half the model state (two nodes of two ranks) between the two extremes."""
    peaks = {s: _get(record_cache, s).peak_allocated_bytes for s in STRATEGIES}
    for sharding, value in peaks.items():
        record_property(f"{sharding} peak_allocated_bytes", value)
    assert peaks["NO_SHARD"] > peaks["SHARD_GRAD_OP"] > peaks["FULL_SHARD"], peaks
    assert peaks["NO_SHARD"] > peaks["HYBRID_SHARD"] > peaks["FULL_SHARD"], peaks


def test_model_state_per_rank_is_each_strategys_share(record_cache) -> None:
    full = _get(record_cache, "FULL_SHARD")
    for sharding, group in (("SHARD_GRAD_OP", 4), ("NO_SHARD", 1), ("HYBRID_SHARD", 2)):
        record = _get(record_cache, sharding)
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            ratio = getattr(record, key) / getattr(full, key)
            assert ratio == pytest.approx(4 / group, rel=1e-6), (
                f"{record.recipe}: {key} {getattr(record, key):,} B is {ratio:.6f} x {full.recipe}'s, not 4/{group}")
    # Every parameter stays gathered after the forward under SHARD_GRAD_OP; the root's only under FULL_SHARD.
    shard_grad_op = _get(record_cache, "SHARD_GRAD_OP")
    assert shard_grad_op.forward_unsharded_params is not None and full.forward_unsharded_params is not None
    assert shard_grad_op.forward_unsharded_params >= shard_grad_op.param_count > full.forward_unsharded_params


def _fall_back(monkeypatch: pytest.MonkeyPatch, to: str) -> None:
    """The strategy silently lost on its way to FSDP (a keyword a wrapper no longer forwards): every unit
    wraps as ``to``."""
    original = sim_sharded.wrap

    def wrap(*args: Any, **kwargs: Any) -> sim_sharded.ShardedModel:
        return original(*args, **{**kwargs, "sharding": to})

    monkeypatch.setattr(sim_sharded, "wrap", wrap)


# The faults replay the smoke ViT (0.4 s a replay, against 3-4 s at article scale: CI's budget): the same
# FSDP1 units, four of them, 4 ranks.
FAULT_SCALE = "smoke"


def _judge(sharding: str, clean: Record) -> str:
    recipe = resolve("vit", FAULT_SCALE, _techniques(sharding))
    injected = simulate(recipe)
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    lines = [comparison.message()] if comparison.failures else []
    return "\n".join(lines + [p for p in active.problems(recipe, injected) if "activation-checkpointing is not active" not in p])


@pytest.mark.parametrize("sharding, to, named", [
    ("SHARD_GRAD_OP", "FULL_SHARD", ("forward_unsharded_params", "phase forward")),
    ("NO_SHARD", "FULL_SHARD", ("optimizer_state_bytes", "phase optimizer_step", "param_bytes")),
    ("HYBRID_SHARD", "FULL_SHARD", ("optimizer_state_bytes", "phase optimizer_step", "param_bytes")),
    ("SHARD_GRAD_OP", "NO_SHARD", ("optimizer_state_bytes", "phase optimizer_step", "grad_bytes")),
    ("FULL_SHARD", "NO_SHARD", ("optimizer_state_bytes", "phase optimizer_step", "param_bytes")),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_strategy_that_falls_back_is_named(sharding, to, named, monkeypatch) -> None:
    clean = simulate(resolve("vit", FAULT_SCALE, _techniques(sharding)))
    _fall_back(monkeypatch, to)
    message = _judge(sharding, clean)
    assert f"vit-{FAULT_SCALE}/{STRATEGIES[sharding]}+activation-checkpointing" in message, message
    assert f"{STRATEGIES[sharding]} is not active" in message, message
    for text in named:
        assert text in message, message
