"""Sharding claims (article 08-11, the ViT-H/14 series, the bonus "after" recipes): FSDP,
activation checkpointing, CPU offload, delayed init.

CPU tier (``dist`` + ``cpu``): the smoke ViT sharded with FSDP2 over gloo in 2 processes, measured
exactly per rank, against the single-process Fabric run of the same recipe and data order. The
ranks are started once for the whole module (starting them costs most of the time).

GPU tier (``dist`` + ``gpu``): Lightning's FSDPStrategy on every GPU the machine has (the article
used 4; the ids and Records say how many ran). A claim about sharding needs 2 GPUs; checkpointing,
offload and delayed init mean something on one. The ViT-H/14 series runs when asked
(``--memclaims-vit-h14``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from fixtures.messages import differs, metric_value, not_related, who
from memclaims.claims.figures import peak, peak_metric
from memclaims.core import published
from memclaims.core.record import Record
from memclaims.measure import active, lightning_fsdp
from memclaims.measure.distributed import DistributedResult, expected_shard_bytes, run_distributed, run_distributed_many
from memclaims.measure.runner import run
from memclaims.pytest.plugin import settings
from memclaims.recipes.named import NAMED_RECIPES
from memclaims.recipes.recipe import Recipe, parse_id, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.report import series
from memclaims.report.candidate import DIST_RANKS, DIST_RUNS
from memclaims.techniques.impl.fully_shard import Fsdp2Parallelize
from memclaims.workloads.registry import gpu_tier_scale

WORLD = DIST_RANKS
# The sharded run sums the two halves' mean losses in another order than one mean over the whole
# batch, and its Adam updates use all-reduced (averaged) gradients: float32 rounding, nothing more.
# Measured: |difference| <= 2.4e-7 on losses of about 2.3.
LOSS_ATOL = 1e-5

FSDP = ("fsdp",)
FSDP_AC = ("fsdp", "activation-checkpointing")

cpu_dist = [pytest.mark.dist, pytest.mark.cpu]

# One worker under -n (--dist loadgroup): the module-scoped fixtures run their process groups/recipes once.
pytestmark = pytest.mark.xdist_group("cpu-sharded")


@pytest.fixture(scope="module")
def single() -> Record:
    """The single-process reference: the fp32 Fabric loop (01-2) the article's FSDP runs start from."""
    return run(resolve("vit", "smoke", []), RunOptions(device="cpu", evaluate=False))


# The sharded smoke recipes with per-rank baselines (the ViT-H/14 series' CPU-runnable steps and
# BigBird's root-only wrap among them), in one process group: memclaims.report.candidate's list.
CPU_RUNS = list(DIST_RUNS)
H14_FSDP = ("16-mixed", "fsdp")
H14_FSDP_AC = ("16-mixed", "fsdp", "activation-checkpointing")


def _group(runs: list[tuple[str, tuple[str, ...]]]) -> dict[tuple[str, tuple[str, ...]], DistributedResult]:
    results = run_distributed_many([resolve(w, "smoke", t) for w, t in runs],
                                   RunOptions(device="cpu", evaluate=False), WORLD, timeout_s=240)
    return dict(zip(runs, results))


DDP_RUNS = [run for run in CPU_RUNS if "ddp" in run[1]]


@pytest.fixture(scope="module")
def cpu_ranks() -> dict[tuple[str, tuple[str, ...]], DistributedResult]:
    """Every CPU_RUNS recipe in one process group: the ranks' start (each imports torch and Lightning, then joins
    the group) is paid once, not once for FSDP's runs and again for DDP's (about 9 CPU s of two ranks' start). DDP's
    run comes last (DIST_RUNS' order), after the FSDP runs, as when it had a process group of its own."""
    return _group(CPU_RUNS)


@pytest.fixture(scope="module")
def cpu_sharded(cpu_ranks) -> dict[tuple[str, tuple[str, ...]], DistributedResult]:
    return {run: result for run, result in cpu_ranks.items() if run not in DDP_RUNS}


@pytest.fixture(scope="module")
def cpu_ddp(cpu_ranks) -> dict[tuple[str, tuple[str, ...]], DistributedResult]:
    return {run: cpu_ranks[run] for run in DDP_RUNS}


@pytest.fixture(scope="module")
def sharded(cpu_sharded) -> dict[tuple[str, ...], DistributedResult]:
    return {techniques: result for (work, techniques), result in cpu_sharded.items() if work == "vit"}


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.parametrize("run_key", CPU_RUNS, ids=[f"cpu:{w}-smoke/{'+'.join(t)}@{WORLD}ranks" for w, t in CPU_RUNS])
def test_every_rank_against_its_baseline(request, run_key, baseline_check, record_property) -> None:
    """Each rank's Record is a regression baseline of its own (``recipe@2/rankN``)."""
    group = request.getfixturevalue("cpu_ddp" if run_key in DDP_RUNS else "cpu_sharded")
    for record in group[run_key].records:
        assert record.devices == WORLD, differs(record, "devices", WORLD)
        baseline_check.check(f"dist-cpu:{record.baseline_key}", record, record_property)


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.parametrize("workload", ["vit"])
def test_ddp_every_rank_holds_the_whole_model_and_the_same_all_reduced_gradients(cpu_ddp, single,
                                                                                   workload) -> None:
    """DDP (bigbird-before's strategy): each rank trains on its own batch of the recipe's size, holds the
    whole model, its gradients and Adam state, and after the backward the gradients are all-reduced: bit
    for bit the same on every rank (memclaims.measure.active)."""
    recipe = resolve(workload, "smoke", ["ddp"])
    records = cpu_ddp[(workload, ("ddp",))].records
    for record in records:
        assert active.problems(recipe, record) == []
    assert active.rank_problems(records) == []
    # Different batches per rank: different local losses (else the all-reduce check would prove nothing).
    assert records[0].final_loss != records[1].final_loss, f"{who(records[0])}: both ranks saw the same batch"
    if workload == "vit":
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            assert getattr(records[0], key) == getattr(single, key), differs(records[0], key, getattr(single, key))


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow  # about 35 s on 2 cores: in the nightly run, not CI's
def test_bigbird_before_recipe_on_cpu_ranks(baseline_check, record_property) -> None:
    """bonus_bigbird-before's recipe (DDP, fp32) at smoke scale on CPU ranks: BigBird's pooler never gets
    a gradient, so DDP runs with find_unused_parameters; every rank holds the whole model and the same
    all-reduced gradients, and each rank is held to its own baseline."""
    named = NAMED_RECIPES["bigbird-before"]
    recipe = resolve(named.workload, "smoke", named.techniques)
    result = run_distributed(recipe, RunOptions(device="cpu", evaluate=False), WORLD, timeout_s=240)
    for record in result.records:
        assert active.problems(recipe, record) == []
        baseline_check.check(f"dist-cpu:{record.baseline_key}", record, record_property)
    assert active.rank_problems(result.records) == []


def _shapes(workload: str = "vit") -> list[tuple[int, ...]]:
    recipe = resolve(workload, "smoke", [])
    model, _ = recipe.workload.build_model(recipe.scale)
    return [tuple(p.shape) for p in model.parameters()]


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.parametrize("techniques", [FSDP, FSDP_AC], ids="+".join)
def test_per_rank_model_state_is_exactly_the_padded_shard(sharded, techniques) -> None:
    """Each rank holds ceil(d0 / N) rows of every parameter (dim 0 padded to a multiple of N)."""
    shapes = _shapes()
    for rank, record in enumerate(sharded[techniques].records):
        expected = expected_shard_bytes(shapes, 4, WORLD, rank)
        measured = {k: getattr(record, k) for k in expected}
        assert measured == expected, (f"{who(record)}: model state {measured} is not the padded-shard "
                                      f"arithmetic {expected} (bytes)")


@pytest.mark.dist
@pytest.mark.cpu
def test_sharding_without_auto_wrap_splits_every_parameter(cpu_sharded) -> None:
    """BigBird "after" has no wrap policy: the root alone shards every parameter, same arithmetic.
    (Its losses are not compared: dropout and random attention blocks draw per process.)"""
    shapes = _shapes("bigbird")
    for rank, record in enumerate(cpu_sharded[("bigbird", FSDP)].records):
        expected = expected_shard_bytes(shapes, 4, WORLD, rank)["param_bytes"]
        assert record.param_bytes == expected, differs(record, "param_bytes", expected, "padded-shard arithmetic")
        # Parameters the forward pass never uses get no gradient; the rest are shards as well.
        assert 0 < record.grad_bytes <= record.param_bytes, not_related(
            record, "in (0, param_bytes]", record.param_bytes, "grad_bytes")
        assert not record.nan_loss, f"{who(record)}: loss diverged at step {record.nan_step}"


@pytest.mark.dist
@pytest.mark.cpu
def test_per_rank_model_state_is_about_one_over_n(single, sharded) -> None:
    """Claim: FSDP divides parameters, gradients and optimizer state by the number of devices,
    up to dim-0 padding (here 1.4 % of the parameters: 2 x 164,756 B vs 324,904 B)."""
    shapes = _shapes()
    padding = sum(math.ceil(s[0] / WORLD) * WORLD * math.prod(s[1:]) for s in shapes) / sum(math.prod(s) for s in shapes)
    for record in sharded[FSDP].records:
        for key in ("param_bytes", "grad_bytes"):
            ratio = getattr(record, key) * WORLD / getattr(single, key)
            assert 1.0 <= ratio <= padding + 1e-12, (
                f"{who(record)}: {key} {getattr(record, key):,} B x {WORLD} ranks / {who(single)}'s "
                f"{getattr(single, key):,} B = {ratio:.6f}, outside [1, {padding:.6f}] (dim-0 padding)")
        # Adam's fp32 ``step`` scalar (one per parameter tensor) is kept whole on every rank.
        steps = 4 * len(shapes)
        limit = (single.optimizer_state_bytes - steps) / WORLD * padding + steps
        assert record.optimizer_state_bytes <= limit, not_related(
            record, "<=", int(limit), "optimizer_state_bytes", f"1/{WORLD} of {who(single)}'s Adam state, padded")
        # The model is the same; only its storage is split.
        assert record.param_count == single.param_count, not_related(record, "==", single, "param_count")


@pytest.mark.dist
@pytest.mark.cpu
def test_sharding_lowers_the_per_rank_peak(single, sharded) -> None:
    for record in sharded[FSDP].records:
        assert record.peak_allocated_bytes < single.peak_allocated_bytes, not_related(
            record, "<", single, "peak_allocated_bytes")


@pytest.mark.dist
@pytest.mark.cpu
def test_activation_checkpointing_lowers_activations_and_peak(sharded) -> None:
    for plain, checkpointed in zip(sharded[FSDP].records, sharded[FSDP_AC].records):
        metric = "breakdown.activations_and_temporaries"
        assert (checkpointed.breakdown["activations_and_temporaries"]
                < plain.breakdown["activations_and_temporaries"]), not_related(checkpointed, "<", plain, metric)
        assert checkpointed.peak_allocated_bytes < plain.peak_allocated_bytes, not_related(
            checkpointed, "<", plain, "peak_allocated_bytes")
        # What the forward pass keeps for backward is what checkpointing saves (memclaims.measure.active).
        inactive = active.problems(resolve("vit", "smoke", FSDP_AC), checkpointed,
                                   without={"activation-checkpointing": plain})
        assert not inactive, "\n".join(inactive)
        # Recomputing activations changes no model state.
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            assert getattr(checkpointed, key) == getattr(plain, key), not_related(checkpointed, "==", plain, key)


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.parametrize("techniques", [FSDP, FSDP_AC], ids="+".join)
def test_loss_equals_the_single_process_run(single, sharded, techniques) -> None:
    """Same init, same global batches (each rank its half), averaged gradients: the same losses,
    before and after optimizer steps."""
    for record in sharded[techniques].records:
        assert len(record.memory_losses) == len(single.memory_losses), not_related(
            record, "as long as", len(single.memory_losses), "memory_losses")
        assert record.memory_losses == pytest.approx(single.memory_losses, abs=LOSS_ATOL, rel=0), (
            f"{who(record)}: memory_losses {record.memory_losses} differ from {who(single)}'s "
            f"{single.memory_losses} by more than {LOSS_ATOL}")
        assert record.final_loss == pytest.approx(single.final_loss, abs=LOSS_ATOL, rel=0), (
            f"{who(record)}: final_loss {record.final_loss} differs from {who(single)}'s {single.final_loss} "
            f"by more than {LOSS_ATOL}")


@pytest.mark.dist
@pytest.mark.cpu
def test_result_reports_rank0_max_over_ranks_and_host_memory(sharded) -> None:
    result = sharded[FSDP]
    assert [r.recipe for r in result.records] == ["vit-smoke/fsdp"] * WORLD
    assert result.rank0 == result.records[0].to_dict()
    for key, value in result.max_over_ranks.items():
        if key == "breakdown":
            continue
        ranks = [getattr(r, key) for r in result.records if getattr(r, key) is not None]
        assert value == (max(ranks) if ranks else None), (
            f"{result.recipe}: max_over_ranks[{key!r}] is {value}, the ranks have {ranks}")
    # Rank 1 holds fewer real rows, so less Adam state: rank 0 is the max here.
    assert result.max_over_ranks["optimizer_state_bytes"] == result.records[0].optimizer_state_bytes, differs(
        result.records[0], "optimizer_state_bytes", result.max_over_ranks["optimizer_state_bytes"], "max over ranks")
    for record in result.records:
        assert record.host_peak_bytes and record.host_peak_bytes > 0, differs(record, "host_peak_bytes", "> 0")
    decoded = __import__("json").loads(result.to_json())
    assert decoded["devices"] == WORLD and len(decoded["ranks"]) == WORLD


@pytest.mark.dist
@pytest.mark.cpu
def test_vit_h14_series_descends_at_smoke_scale(cpu_sharded) -> None:
    """The series' bars one process -> FSDP -> + checkpointing, per rank (offload needs a GPU).
    16-mixed runs as bf16-mixed on the CPU, on both sides. Checkpointing lowers the forward, where the
    activations live; at smoke scale, with the bf16 all-gathers Lightning's FSDPPrecision configures, the
    rank's peak is its optimizer step (fp32 state, untouched by checkpointing), so the peak may stay equal."""
    one = run(resolve("vit-h14", "smoke", ("16-mixed",)), RunOptions(device="cpu", evaluate=False))
    fsdp, checkpointed = cpu_sharded[("vit-h14", H14_FSDP)], cpu_sharded[("vit-h14", H14_FSDP_AC)]
    assert {r.precision for r in fsdp.records + checkpointed.records} == {one.precision} == {"bf16-mixed"}
    for plain, recomputed in zip(fsdp.records, checkpointed.records):
        assert plain.peak_allocated_bytes < one.peak_allocated_bytes, not_related(plain, "<", one, "peak_allocated_bytes")
        forward = "phases.forward.allocated_bytes"
        assert metric_value(recomputed, forward) < metric_value(plain, forward), not_related(
            recomputed, "<", plain, forward)
        assert recomputed.peak_allocated_bytes <= plain.peak_allocated_bytes, not_related(
            recomputed, "<=", plain, "peak_allocated_bytes")
        assert plain.param_bytes < one.param_bytes, not_related(plain, "<", one, "param_bytes")
        # `memclaims reproduce --all` judges the same bar on the same Records (its series step): CI's form of it.
        verdict = series.step(plain, recomputed, lambda record: record.peak_allocated_bytes, None)
        assert verdict.passed, verdict.detail


@pytest.mark.cpu
def test_expected_shard_bytes_arithmetic() -> None:
    # dim 0 = 3 over 2 ranks: storage of 2 rows on both; rank 0 holds 2 real rows, rank 1 one.
    assert expected_shard_bytes([(3, 5)], 4, 2, 0) == {"param_bytes": 40, "grad_bytes": 40,
                                                        "optimizer_state_bytes": 2 * 40 + 4}
    assert expected_shard_bytes([(3, 5)], 4, 2, 1) == {"param_bytes": 40, "grad_bytes": 40,
                                                        "optimizer_state_bytes": 2 * 20 + 4}
    # dim 0 = 1 (ViT's class token): rank 1 holds nothing but keeps the padded storage.
    assert expected_shard_bytes([(1, 1, 64)], 4, 2, 1)["optimizer_state_bytes"] == 4


@pytest.mark.cpu
def test_distributed_refusals_are_usage_errors() -> None:
    from memclaims.core.errors import UsageError

    options = RunOptions(device="cpu", evaluate=False)
    with pytest.raises(UsageError, match="runs on one device"):
        run_distributed(resolve("vit", "smoke", []), options, 2)
    with pytest.raises(UsageError, match="needs --device cuda"):
        run_distributed(resolve("vit", "smoke", ["fsdp", "cpu-offload"]), options, 2)
    with pytest.raises(UsageError, match="does not split evenly"):
        run_distributed(resolve("vit", "smoke", FSDP), options, 3)
    with pytest.raises(UsageError, match="memclaims.run"):
        run(resolve("vit", "smoke", FSDP), options)


# --- FSDP's other sharding strategies (issue #27), nightly -------------------------------------
# FSDP2's equivalents on the CPU ranks (memclaims.techniques.fsdp.FSDP2_SHARDINGS). One process group of
# 2 ranks for SHARD_GRAD_OP and NO_SHARD (about 50 s on 2 cores, the group's start included), one of 4
# for HYBRID_SHARD against FULL_SHARD (about 80 s): HYBRID_SHARD's two simulated nodes need 2 ranks each
# to differ from NO_SHARD. Over CI's budget: the nightly runs them (slow).

STRATEGY_RUNS: list[tuple[str, tuple[str, ...]]] = [("vit", ("fsdp-shard-grad-op",)), ("vit", ("fsdp-no-shard",))]
HYBRID_RANKS = 4
HYBRID_RUNS: list[tuple[str, tuple[str, ...]]] = [("vit", FSDP), ("vit", ("fsdp-hybrid",))]
cpu_dist_nightly = [pytest.mark.dist, pytest.mark.cpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def cpu_strategies() -> dict[tuple[str, ...], DistributedResult]:
    return {t: r for (_, t), r in _group(STRATEGY_RUNS).items()}


@pytest.fixture(scope="module")
def cpu_hybrid() -> dict[tuple[str, ...], DistributedResult]:
    results = run_distributed_many([resolve(w, "smoke", t) for w, t in HYBRID_RUNS],
                                   RunOptions(device="cpu", evaluate=False), HYBRID_RANKS, timeout_s=400)
    return {t: r for (_, t), r in zip(HYBRID_RUNS, results)}


@pytest.mark.parametrize("run_key", STRATEGY_RUNS + HYBRID_RUNS[1:],
                         ids=[f"cpu:{w}-smoke/{'+'.join(t)}@{HYBRID_RANKS if (w, t) in HYBRID_RUNS else WORLD}ranks"
                              for w, t in STRATEGY_RUNS + HYBRID_RUNS[1:]])
@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow
def test_every_strategy_rank_against_its_baseline(request, run_key, baseline_check, record_property) -> None:
    """Every rank judged (and, on a first run, stored as obtained) before the case fails."""
    group = request.getfixturevalue("cpu_hybrid" if run_key in HYBRID_RUNS else "cpu_strategies")
    _judge_every_rank(group[run_key[1]].records, baseline_check, record_property)


def _judge_every_rank(records: list[Record], baseline_check, record_property) -> None:
    """Each rank against its baseline, all of them judged (and, on a first run, stored as obtained) before
    the case fails with every rank's message."""
    failures = []
    for record in records:
        try:
            baseline_check.check(f"dist-cpu:{record.baseline_key}", record, record_property)
        except pytest.fail.Exception as failure:
            failures.append(str(failure))
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


def _same_losses(record: Record, single: Record) -> None:
    assert record.memory_losses == pytest.approx(single.memory_losses, abs=LOSS_ATOL, rel=0), (
        f"{who(record)}: memory_losses {record.memory_losses} differ from {who(single)}'s {single.memory_losses}")


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow
def test_sharding_strategies_keep_their_share_per_rank(single, sharded, cpu_strategies, record_property) -> None:
    """Claims fsdp-no-shard-replicates and fsdp-shard-grad-op-shards-outside-computation (PyTorch's
    ShardingStrategy docstring) on CPU ranks: a SHARD_GRAD_OP rank holds FULL_SHARD's padded shards of the
    parameters, gradients and Adam state, but every parameter is still gathered after the forward (so the
    forward's peak is above FULL_SHARD's); a NO_SHARD rank holds the whole model, as the single process
    does. Each trains exactly as the single process (same global batch, averaged gradients)."""
    shapes = _shapes()
    full = sharded[FSDP].records
    zero2, whole = cpu_strategies[("fsdp-shard-grad-op",)].records, cpu_strategies[("fsdp-no-shard",)].records
    for rank in range(WORLD):
        expected = expected_shard_bytes(shapes, 4, WORLD, rank)
        for record, shares in ((zero2[rank], expected), (whole[rank], expected_shard_bytes(shapes, 4, 1, 0))):
            measured = {k: getattr(record, k) for k in shares}
            assert measured == shares, f"{who(record)}: model state {measured} is not {shares} (bytes)"
            assert active.problems(parse_id(record.recipe), record) == []
            _same_losses(record, single)
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            assert getattr(whole[rank], key) == getattr(single, key), differs(whole[rank], key, getattr(single, key))
        assert zero2[rank].forward_unsharded_params == single.param_count, differs(
            zero2[rank], "forward_unsharded_params", single.param_count, "every parameter, gathered after phase forward")
        assert (full[rank].forward_unsharded_params or 0) < single.param_count, not_related(
            full[rank], "<", single.param_count, "forward_unsharded_params")
        forward = {name: r.phases["forward"]["allocated_bytes"] for name, r in
                   (("FULL_SHARD", full[rank]), ("SHARD_GRAD_OP", zero2[rank]))}
        record_property(f"rank{rank} forward allocated_bytes", forward)
        assert forward["SHARD_GRAD_OP"] > forward["FULL_SHARD"], not_related(
            zero2[rank], ">", full[rank], "phases.forward.allocated_bytes")
        peaks = [r.peak_allocated_bytes for r in (whole[rank], zero2[rank], full[rank])]
        record_property(f"rank{rank} peak NO_SHARD, SHARD_GRAD_OP, FULL_SHARD", peaks)
        assert peaks[0] > peaks[1] > peaks[2], (f"rank {rank}: peak_allocated_bytes NO_SHARD, SHARD_GRAD_OP, "
                                                f"FULL_SHARD {peaks} are not in decreasing order")


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow
def test_hybrid_shards_within_each_simulated_node(single, cpu_hybrid) -> None:
    """HYBRID_SHARD over 4 CPU ranks as 2 simulated nodes (a (2, 2) device mesh): each rank holds its node's
    half of the model (FULL_SHARD over 4: a quarter), exactly the padded-shard arithmetic over 2 ranks."""
    shapes = _shapes()
    full, hybrid = cpu_hybrid[FSDP].records, cpu_hybrid[("fsdp-hybrid",)].records
    for rank in range(HYBRID_RANKS):
        for record, group in ((full[rank], HYBRID_RANKS), (hybrid[rank], HYBRID_RANKS // 2)):
            expected = expected_shard_bytes(shapes, 4, group, rank % group)
            measured = {k: getattr(record, k) for k in expected}
            assert measured == expected, f"{who(record)}: model state {measured} is not {expected} (bytes)"
            assert active.problems(parse_id(record.recipe), record) == []
            _same_losses(record, single)
        assert hybrid[rank].peak_allocated_bytes > full[rank].peak_allocated_bytes, not_related(
            hybrid[rank], ">", full[rank], "peak_allocated_bytes")


@pytest.mark.cpu
def test_cpu_ranks_refuse_hybrid_on_an_odd_world() -> None:
    from memclaims.core.errors import UsageError

    with pytest.raises(UsageError, match="HYBRID_SHARD over 2 simulated nodes needs a number of ranks divisible by 2"):
        run_distributed(resolve("vit", "smoke", ["fsdp-hybrid"]), RunOptions(device="cpu", evaluate=False), 3)


# --- FSDP2 (issue #27): fully_shard with reshard_after_forward on and off, nightly ------------
# The CPU ranks run fully_shard for every FSDP technique; fsdp2 and fsdp2-no-reshard ask for it by name (the
# same calls as fsdp and fsdp-shard-grad-op there; on CUDA ModelParallelStrategy instead of FSDPStrategy, on the
# sim FSDP2's replay instead of FSDP1's). One process group of 2 ranks for both (about 50 s on 2 cores).

FSDP2_RUNS: list[tuple[str, tuple[str, ...]]] = [("vit", ("fsdp2",)), ("vit", ("fsdp2-no-reshard",))]


@pytest.fixture(scope="module")
def cpu_fsdp2() -> dict[tuple[str, ...], DistributedResult]:
    return {t: r for (_, t), r in _group(FSDP2_RUNS).items()}


@pytest.mark.parametrize("techniques", [t for _, t in FSDP2_RUNS],
                         ids=[f"cpu:vit-smoke/{'+'.join(t)}@{WORLD}ranks" for _, t in FSDP2_RUNS])
@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow
def test_every_fsdp2_rank_against_its_baseline(cpu_fsdp2, techniques, baseline_check, record_property) -> None:
    """Every rank judged (and, on a first run, stored as obtained) before the case fails."""
    _judge_every_rank(cpu_fsdp2[techniques].records, baseline_check, record_property)


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow
def test_fsdp2_ranks_shard_and_keep_unsharded_as_asked(single, cpu_fsdp2, record_property) -> None:
    """Claim fsdp2-no-reshard-keeps-unsharded (fully_shard's docstring) on CPU ranks: both hold exactly FSDP2's
    padded dim-0 shards of the parameters, gradients and Adam state; with reshard_after_forward=False every
    parameter is still unsharded after the forward (True: the root's only), so the forward's peak is higher;
    each trains as the single process; the Records say FSDP2 ran, with which setting; and the sim's FSDP2
    replay of rank 0 holds the same parameter and gradient bytes."""
    from memclaims.sim import simulate

    shapes = _shapes()
    resharded, kept = cpu_fsdp2[("fsdp2",)].records, cpu_fsdp2[("fsdp2-no-reshard",)].records
    for rank in range(WORLD):
        expected = expected_shard_bytes(shapes, 4, WORLD, rank)
        for record, setting in ((resharded[rank], True), (kept[rank], False)):
            measured = {k: getattr(record, k) for k in expected}
            assert measured == expected, f"{who(record)}: model state {measured} is not {expected} (bytes)"
            assert active.problems(parse_id(record.recipe), record) == []
            assert record.fsdp_api == "fsdp2", differs(record, "fsdp_api", "fsdp2")
            assert any(f"reshard_after_forward={setting}" in note for note in record.notes), record.notes
            _same_losses(record, single)
        assert kept[rank].forward_unsharded_params == single.param_count, differs(
            kept[rank], "forward_unsharded_params", single.param_count, "every parameter, unsharded after phase forward")
        assert (resharded[rank].forward_unsharded_params or 0) < single.param_count, not_related(
            resharded[rank], "<", single.param_count, "forward_unsharded_params")
        forward = [r.phases["forward"]["allocated_bytes"] for r in (kept[rank], resharded[rank])]
        record_property(f"rank{rank} forward allocated_bytes no-reshard, reshard", forward)
        record_property(f"rank{rank} peak_allocated_bytes no-reshard, reshard",
                        [kept[rank].peak_allocated_bytes, resharded[rank].peak_allocated_bytes])
        assert forward[0] > forward[1], not_related(kept[rank], ">", resharded[rank], "phases.forward.allocated_bytes")
    for technique, records in ((("fsdp2",), resharded), (("fsdp2-no-reshard",), kept)):
        replay = simulate(resolve("vit", "smoke", technique), devices=WORLD)
        for key in ("param_bytes", "grad_bytes"):
            assert getattr(replay, key) == getattr(records[0], key), differs(replay, key, getattr(records[0], key))


@pytest.mark.cpu
@pytest.mark.parametrize("technique, reshard", [("fsdp2", True), ("fsdp2-no-reshard", False)])
def test_cuda_fsdp2_is_model_parallel_strategy_with_fully_shard_per_block(technique, reshard, monkeypatch) -> None:
    """FSDP2 on CUDA: Lightning's ModelParallelStrategy, every rank data-parallel; its parallelize_fn applies
    fully_shard to each EncoderBlock (inside its checkpoint wrapper) with the recipe's reshard_after_forward
    over the mesh's data_parallel dimension, then to the root with FSDP2's default. Only the configuration
    can be checked without GPUs: the mesh is a stand-in and fully_shard records its calls."""
    import torch.distributed.fsdp as fsdp
    from lightning.fabric.strategies.model_parallel import ModelParallelStrategy
    from torchvision.models.vision_transformer import EncoderBlock

    recipe = resolve("vit", "smoke", (technique, "activation-checkpointing"))
    strategy = lightning_fsdp.strategy(recipe, 4)
    assert isinstance(strategy, ModelParallelStrategy)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)
    parallelize = strategy._parallelize_fn
    assert isinstance(parallelize, Fsdp2Parallelize)
    assert parallelize.reshard_after_forward is reshard and parallelize.checkpointing

    calls: list[tuple[nn.Module, dict[str, Any]]] = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kwargs: calls.append((module, kwargs)) or module)
    data_parallel = object()
    model, _ = recipe.workload.build_model(recipe.scale)
    assert parallelize(model, {"data_parallel": data_parallel}) is model
    blocks = [m for m in model.modules() if isinstance(m, EncoderBlock)]
    *wrapped, root = calls
    assert [getattr(m, "_checkpoint_wrapped_module", None) for m, _ in wrapped] == blocks
    assert all(kwargs == {"mesh": data_parallel, "reshard_after_forward": reshard} for _, kwargs in wrapped)
    assert root == (model, {"mesh": data_parallel})


# --- GPU: Lightning's FSDPStrategy on every GPU of the machine ------------------------------

GPUS = torch.cuda.device_count()
GB = 1e9  # the article prints max_memory_reserved() / 1e9
ARTICLE_08_11 = (FSDP_AC, FSDP_AC + ("cpu-offload",), FSDP_AC + ("cpu-offload", "delayed-init"))
# Rank 0 of the article's 4-GPU runs 08, 09 and 11, decimal GB (memclaims/resources/published.json).
PUBLISHED_08_11 = {techniques: published.row("multi_gpu", script)["peak_reserved_gb"] for techniques, script in
                   zip(ARTICLE_08_11, ("08_fsdp-with-01-2", "09_fsdp-cpu-offload-with-01-2", "11_delay-allocation"))}
# A GPU run's allocator may differ from the exact shard by FlatParameter padding and rounding.
SHARD_TOLERANCE = 0.05


def gpu_ids(name: str) -> list[Any]:
    """One param whose id says how many GPUs ran: ``[gpu:vit@4gpu]``."""
    return [pytest.param(GPUS, id=f"gpu:{name}@{GPUS}gpu")]


@pytest.fixture(scope="module")
def gpu_scale(request: pytest.FixtureRequest) -> str:
    """What --memclaims-gpu-scale asks for (smoke or article); ``_at`` maps it per workload."""
    return settings(request.config).gpu_scale


def _at(workload_name: str, requested: str) -> str:
    return gpu_tier_scale(workload_name, requested)


@pytest.fixture(scope="module")
def gpu_single(record_cache, gpu_scale) -> Record:
    """The single-GPU fp32 Fabric run (01-2) the sharded scripts start from."""
    return record_cache.get("gpu", resolve("vit", _at("vit", gpu_scale), ("fabric",)))


@pytest.fixture(scope="module")
def gpu_sharded(gpu_scale) -> dict[tuple[str, ...], DistributedResult]:
    """FSDP alone, then 08, 09 and 11, on every GPU; the ranks are started once for all four."""
    configurations = [FSDP, *ARTICLE_08_11]
    results = run_distributed_many([resolve("vit", _at("vit", gpu_scale), c) for c in configurations],
                                   RunOptions(device="cuda", evaluate=False), GPUS, timeout_s=600)
    return dict(zip(configurations, results))


def _report(record_property: Callable[[str, object], None], result: DistributedResult,
            published_gb: float | None = None) -> None:
    rank0 = result.records[0].peak_reserved_total_bytes
    record_property(f"{result.recipe}@{result.devices}gpu rank0_gb", round(rank0 / GB, 3))
    if published_gb is not None:
        record_property(f"{result.recipe} published_gb (4 GPUs)", published_gb)


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=2)
@pytest.mark.parametrize("devices", gpu_ids("vit"))
def test_gpu_fsdp_with_checkpointing_below_single_gpu_peak(gpu_single, gpu_sharded, devices,
                                                           record_property) -> None:
    """Article: 26.84 GB on one GPU -> 6.59 GB per GPU with FSDP + activation checkpointing on 4."""
    result = gpu_sharded[FSDP_AC]
    _report(record_property, result, PUBLISHED_08_11[FSDP_AC])
    assert result.devices == devices
    for record in result.records:
        assert peak(record) < peak(gpu_single), not_related(
            record, "<", gpu_single, peak_metric(record))


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=2)
@pytest.mark.parametrize("devices", gpu_ids("vit"))
def test_gpu_per_rank_model_state_about_one_over_n(gpu_single, gpu_sharded, devices) -> None:
    for record in gpu_sharded[FSDP].records:
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            share = getattr(record, key) * devices / getattr(gpu_single, key)
            assert 1 - SHARD_TOLERANCE <= share <= 1 + SHARD_TOLERANCE, (
                f"{who(record)}: {key} {getattr(record, key):,} B x {devices} / {who(gpu_single)}'s "
                f"{getattr(gpu_single, key):,} B = {share:.4f}, outside 1 +- {SHARD_TOLERANCE}")
        assert record.param_count == gpu_single.param_count, not_related(record, "==", gpu_single, "param_count")


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=1)
@pytest.mark.parametrize("devices", gpu_ids("vit"))
def test_gpu_activation_checkpointing_lowers_the_peak(gpu_sharded, devices) -> None:
    for plain, checkpointed in zip(gpu_sharded[FSDP].records, gpu_sharded[FSDP_AC].records):
        assert peak(checkpointed) < peak(plain), not_related(
            checkpointed, "<", plain, peak_metric(checkpointed))


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=1)
@pytest.mark.parametrize("devices", gpu_ids("vit"))
def test_gpu_cpu_offload_lowers_gpu_peak_raises_host_memory_and_time(gpu_sharded, devices,
                                                                     record_property) -> None:
    """Article: 6.59 -> 6.03 GB, 5.53 -> 8.34 min. Both sides: the GPU peak falls, host memory rises."""
    plain, offload = gpu_sharded[ARTICLE_08_11[0]], gpu_sharded[ARTICLE_08_11[1]]
    _report(record_property, offload, PUBLISHED_08_11[ARTICLE_08_11[1]])
    for before, after in zip(plain.records, offload.records):
        assert peak(after) < peak(before), not_related(
            after, "<", before, peak_metric(after))
        assert after.host_peak_bytes > before.host_peak_bytes, not_related(after, ">", before, "host_peak_bytes")
        # What moved: the rank's parameters and optimizer state are on the host, by category.
        assert before.host_state_bytes == {}, before.host_state_bytes
        assert after.host_state_bytes.get("parameters", 0) > 0 and after.host_state_bytes.get("optimizer_state", 0) > 0, (
            f"{after.recipe}: host_state_bytes {after.host_state_bytes}: CPU offload kept no parameters or "
            "optimizer state on the host")
        assert after.step_time_s > before.step_time_s, not_related(after, ">", before, "step_time_s")
        inactive = active.problems(parse_id(after.recipe), after)
        assert not inactive, "\n".join(inactive)


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=1)
@pytest.mark.parametrize("devices", gpu_ids("vit"))
def test_gpu_delayed_init_changes_nothing(gpu_sharded, devices, record_property) -> None:
    """Article (logs of 11): 6.03 -> 6.03 GB."""
    before, after = gpu_sharded[ARTICLE_08_11[1]], gpu_sharded[ARTICLE_08_11[2]]
    _report(record_property, after, PUBLISHED_08_11[ARTICLE_08_11[2]])
    for a, b in zip(before.records, after.records):
        assert b.peak_reserved_total_bytes == pytest.approx(a.peak_reserved_total_bytes, rel=0.02), not_related(
            b, "within 2 % of", a, "peak_reserved_total_bytes")


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=1)
@pytest.mark.parametrize("techniques", [FSDP, *ARTICLE_08_11],
                         ids=[f"gpu:vit/{'+'.join(t)}@{GPUS}gpu" for t in [FSDP, *ARTICLE_08_11]])
def test_gpu_every_rank_against_its_baseline(gpu_sharded, techniques, baseline_check, record_property) -> None:
    for record in gpu_sharded[techniques].records:
        assert record.devices == GPUS, differs(record, "devices", GPUS)
        baseline_check.check(f"dist-gpu:{record.baseline_key}", record, record_property)


def _named_on_gpus(name: str, gpu_scale: str, request: pytest.FixtureRequest,
                   record_property: Callable[[str, object], None]) -> tuple[Recipe, DistributedResult]:
    """A named recipe of the LLM bonus on this machine's GPUs, at the tier's scale, its rank 0 reported."""
    named = NAMED_RECIPES[name]
    recipe = resolve(named.workload, _at(named.workload, gpu_scale), named.techniques)
    data_dir = settings(request.config).data_dir  # IMDb, when the user has it
    result = run_distributed(recipe, RunOptions(device="cuda", evaluate=False, data_dir=data_dir), GPUS,
                             timeout_s=600)
    _report(record_property, result, named.published.peak_gb)
    return recipe, result


# The LLM bonus "after" recipes. Their "before" recipes need DeepSpeed or DDP, so each "after" is
# held to the article's own claim at article scale: DistilBERT below the "before" peak (3.99 GB),
# BigBird within 4.03 GB per GPU (claim 13), +10 % for another GPU and software generation.
BONUS_AFTER = {"distilbert-after": NAMED_RECIPES["distilbert-before"].published.peak_gb,
               "bigbird-after": 1.10 * NAMED_RECIPES["bigbird-after"].published.peak_gb}


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=1)
@pytest.mark.parametrize("name", list(BONUS_AFTER), ids=[f"gpu:{n}@{GPUS}gpu" for n in BONUS_AFTER])
def test_gpu_bonus_after_recipe(name, gpu_scale, request, baseline_check, record_property) -> None:
    named = NAMED_RECIPES[name]
    _, result = _named_on_gpus(name, gpu_scale, request, record_property)
    for record in result.records:
        assert not record.nan_loss, f"{who(record)}: loss diverged at step {record.nan_step}"
        if gpu_scale == "article":
            assert record.peak_reserved_total_bytes < BONUS_AFTER[name] * GB, (
                f"{who(record)}: peak_reserved_total_bytes {record.peak_reserved_total_bytes / GB:.2f} GB "
                f"(decimal) per GPU is not below {BONUS_AFTER[name]:.2f} GB "
                f"(published {named.published.peak_gb} GB on {named.devices} GPUs)")
        baseline_check.check(f"dist-gpu:{record.baseline_key}", record, record_property)


# The LLM bonus "before" recipes as the scripts ran them (issue #26): DistilBERT under DeepSpeed ZeRO-2
# with 16-mixed, BigBird under DDP, 4 GPUs. On as many GPUs as published, each rank's peak is held to the
# published figure, +10 % for another GPU and software generation; on fewer, a rank holds more of the
# sharded state (ZeRO-2) or the same (DDP), so the figures are reported and compared with the baselines.
BONUS_BEFORE = [pytest.param("distilbert-before", marks=pytest.mark.requires(cuda_devices=1, packages="deepspeed"),
                             id=f"gpu:distilbert-before@{GPUS}gpu"),
                pytest.param("bigbird-before", marks=pytest.mark.requires(cuda_devices=1),
                             id=f"gpu:bigbird-before@{GPUS}gpu")]


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.parametrize("name", BONUS_BEFORE)
def test_gpu_bonus_before_recipe(name, gpu_scale, request, baseline_check, record_property) -> None:
    named = NAMED_RECIPES[name]
    recipe, result = _named_on_gpus(name, gpu_scale, request, record_property)
    bound = 1.10 * named.published.peak_gb
    for record in result.records:
        assert not record.nan_loss, f"{who(record)}: loss diverged at step {record.nan_step}"
        assert active.problems(recipe, record) == []
        if gpu_scale == "article" and GPUS == named.devices:
            assert record.peak_reserved_total_bytes <= bound * GB, (
                f"{who(record)}: peak_reserved_total_bytes {record.peak_reserved_total_bytes / GB:.2f} GB (decimal) "
                f"per GPU is above {bound:.2f} GB (published {named.published.peak_gb} GB on {named.devices} GPUs, +10 %)")
        baseline_check.check(f"dist-gpu:{record.baseline_key}", record, record_property)


# The ViT-H/14 series, when asked: one GPU -> FSDP -> + checkpointing -> + offload.
H14_ONE_GPU = ("16-mixed",)
H14_SERIES = (H14_FSDP, H14_FSDP_AC, H14_FSDP_AC + ("cpu-offload",))


@pytest.fixture(scope="module")
def vit_h14_series(record_cache, gpu_scale) -> dict[tuple[str, ...], Any]:
    """Its tests require --memclaims-vit-h14 (an opt-in: the series is large)."""
    series: dict[tuple[str, ...], Any] = {H14_ONE_GPU: record_cache.get("gpu", resolve("vit-h14", _at("vit-h14", gpu_scale), H14_ONE_GPU))}
    results = run_distributed_many([resolve("vit-h14", _at("vit-h14", gpu_scale), t) for t in H14_SERIES],
                                   RunOptions(device="cuda", evaluate=False), GPUS, timeout_s=600)
    series.update(zip(H14_SERIES, results))
    return series


def _h14_published(techniques: tuple[str, ...]) -> float | None:
    return next((r.published.peak_gb for r in NAMED_RECIPES.values()
                 if r.workload == "vit-h14" and tuple(r.techniques) == techniques), None)


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=2, options="vit-h14")
@pytest.mark.parametrize("devices", gpu_ids("vit-h14"))
def test_gpu_vit_h14_fsdp_below_one_gpu(vit_h14_series, devices, record_property) -> None:
    """Series: 22.6 GB on one GPU -> 17.2 GB per GPU with FSDP (4 GPUs)."""
    one, fsdp = vit_h14_series[H14_ONE_GPU], vit_h14_series[H14_FSDP]
    record_property("one_gpu_gb", round(one.peak_reserved_total_bytes / GB, 3))
    _report(record_property, fsdp, _h14_published(H14_FSDP))
    for record in fsdp.records:
        assert peak(record) < peak(one), not_related(
            record, "<", one, peak_metric(record))


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=1, options="vit-h14")
@pytest.mark.parametrize("devices", gpu_ids("vit-h14"))
def test_gpu_vit_h14_checkpointing_then_offload_descend(vit_h14_series, devices, record_property) -> None:
    """Series: 17.2 -> 9.0 GB with activation checkpointing -> 6.7 GB with CPU offload (4 GPUs)."""
    for techniques in H14_SERIES:
        _report(record_property, vit_h14_series[techniques], _h14_published(techniques))
    plain, checkpointed, offload = (vit_h14_series[t].records for t in H14_SERIES)
    for a, b, c in zip(plain, checkpointed, offload):
        assert b.peak_reserved_total_bytes < a.peak_reserved_total_bytes, not_related(b, "<", a, "peak_reserved_total_bytes")
        assert c.peak_reserved_total_bytes < b.peak_reserved_total_bytes, not_related(c, "<", b, "peak_reserved_total_bytes")
        assert c.host_peak_bytes > b.host_peak_bytes, not_related(c, ">", b, "host_peak_bytes")


@pytest.mark.cpu
def test_cuda_strategy_is_the_articles() -> None:
    """Scripts 08/09: auto-wrap and checkpoint EncoderBlock, offload parameters. Only the
    configuration can be checked without GPUs (Lightning's private attributes, read-only)."""
    from torchvision.models.vision_transformer import EncoderBlock

    offload = lightning_fsdp.strategy(resolve("vit", "smoke", FSDP_AC + ("cpu-offload",)))
    assert offload._fsdp_kwargs["auto_wrap_policy"]._module_classes == {EncoderBlock}
    assert offload._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {EncoderBlock}
    assert offload.cpu_offload.offload_params
    plain = lightning_fsdp.strategy(resolve("vit", "smoke", FSDP))
    assert not plain.cpu_offload.offload_params and not plain._activation_checkpointing_kwargs



@pytest.mark.cpu
@pytest.mark.parametrize("technique, sharding, mesh", [
    ("fsdp", "FULL_SHARD", None), ("fsdp-shard-grad-op", "SHARD_GRAD_OP", None), ("fsdp-no-shard", "NO_SHARD", None),
    ("fsdp-hybrid", "HYBRID_SHARD", (2, 2))])
def test_cuda_strategy_carries_the_sharding_strategy(technique, sharding, mesh) -> None:
    """Issue #27: Lightning's FSDPStrategy gets the technique's sharding_strategy; HYBRID_SHARD a (2, N/2)
    device mesh (two simulated nodes of one machine's GPUs)."""
    strategy = lightning_fsdp.strategy(resolve("vit", "smoke", (technique,)), 4)
    assert strategy.sharding_strategy.name == sharding
    assert strategy._fsdp_kwargs.get("device_mesh") == mesh


@pytest.mark.dist
@pytest.mark.gpu
@pytest.mark.requires(cuda_devices=2)
@pytest.mark.parametrize("devices", gpu_ids("vit"))
def test_gpu_fsdp2_shards_and_keeps_unsharded_as_asked(gpu_scale, devices, record_property) -> None:
    """fsdp2 and fsdp2-no-reshard through ModelParallelStrategy on every GPU: each rank reports FSDP2 and about
    1/N of the model state, and is active; keeping the parameters unsharded after the forward raises the
    rank's peak."""
    runs = [("fsdp2", "activation-checkpointing"), ("fsdp2-no-reshard", "activation-checkpointing")]
    results = run_distributed_many([resolve("vit", _at("vit", gpu_scale), t) for t in runs],
                                   RunOptions(device="cuda", evaluate=False), devices, timeout_s=600)
    for result in results:
        _report(record_property, result)
        for record in result.records:
            assert record.fsdp_api == "fsdp2", differs(record, "fsdp_api", "fsdp2")
            inactive = active.problems(parse_id(record.recipe), record)
            assert not inactive, "\n".join(inactive)
    for resharded, kept in zip(results[0].records, results[1].records):
        assert peak(kept) > peak(resharded), not_related(kept, ">", resharded, peak_metric(kept))
