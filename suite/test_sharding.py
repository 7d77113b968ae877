"""Sharding claims (article 08-11): FSDP, activation checkpointing, CPU offload, delayed init.

CPU tier (``dist`` + ``cpu``): the smoke ViT sharded with FSDP2 over gloo in 2 processes, measured
exactly per rank, against the single-process Fabric run of the same recipe and data order. The
ranks are started once for the whole module (starting them costs most of the time).

GPU tier (``dist`` + ``gpu``): the article's own numbers, rank 0, Lightning's FSDPStrategy.
"""

from __future__ import annotations

import math

import pytest
import torch

from memclaims import distributed
from memclaims.distributed import DistributedResult, expected_shard_bytes, run_distributed, run_distributed_many
from memclaims.recipe import resolve
from memclaims.record import Record
from memclaims.runner import RunOptions, run

WORLD = 2
# The sharded run sums the two halves' mean losses in another order than one mean over the whole
# batch, and its Adam updates use all-reduced (averaged) gradients: float32 rounding, nothing more.
# Measured: |difference| <= 2.4e-7 on losses of about 2.3.
LOSS_ATOL = 1e-5

FSDP = ("fsdp",)
FSDP_AC = ("fsdp", "activation-checkpointing")

cpu_dist = [pytest.mark.dist, pytest.mark.cpu]


@pytest.fixture(scope="module")
def single() -> Record:
    """The single-process reference: the fp32 Fabric loop (01-2) the article's FSDP runs start from."""
    return run(resolve("vit", "smoke", []), RunOptions(device="cpu", evaluate=False))


@pytest.fixture(scope="module")
def sharded() -> dict[tuple[str, ...], DistributedResult]:
    configurations = [FSDP, FSDP_AC]
    results = run_distributed_many([resolve("vit", "smoke", c) for c in configurations],
                                   RunOptions(device="cpu", evaluate=False), WORLD, timeout_s=240)
    return dict(zip(configurations, results))


def _shapes() -> list[tuple[int, ...]]:
    model, _ = resolve("vit", "smoke", []).workload.build_model(resolve("vit", "smoke", []).scale)
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
        assert measured == expected, f"rank {rank}"


@pytest.mark.dist
@pytest.mark.cpu
def test_per_rank_model_state_is_about_one_over_n(single, sharded) -> None:
    """Claim: FSDP divides parameters, gradients and optimizer state by the number of devices,
    up to dim-0 padding (here 1.4 % of the parameters: 2 x 164,756 B vs 324,904 B)."""
    shapes = _shapes()
    padding = sum(math.ceil(s[0] / WORLD) * WORLD * math.prod(s[1:]) for s in shapes) / sum(math.prod(s) for s in shapes)
    for rank, record in enumerate(sharded[FSDP].records):
        for key in ("param_bytes", "grad_bytes"):
            ratio = getattr(record, key) * WORLD / getattr(single, key)
            assert 1.0 <= ratio <= padding + 1e-12, (rank, key, ratio)
        # Adam's fp32 ``step`` scalar (one per parameter tensor) is kept whole on every rank.
        steps = 4 * len(shapes)
        assert record.optimizer_state_bytes - steps <= (single.optimizer_state_bytes - steps) / WORLD * padding
        assert record.param_count == single.param_count  # the model is the same; only its storage is split


@pytest.mark.dist
@pytest.mark.cpu
def test_sharding_lowers_the_per_rank_peak(single, sharded) -> None:
    for record in sharded[FSDP].records:
        assert record.peak_allocated_bytes < single.peak_allocated_bytes


@pytest.mark.dist
@pytest.mark.cpu
def test_activation_checkpointing_lowers_activations_and_peak(sharded) -> None:
    for plain, checkpointed in zip(sharded[FSDP].records, sharded[FSDP_AC].records):
        assert (checkpointed.breakdown["activations_and_temporaries"]
                < plain.breakdown["activations_and_temporaries"])
        assert checkpointed.peak_allocated_bytes < plain.peak_allocated_bytes
        # Recomputing activations changes no model state.
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            assert getattr(checkpointed, key) == getattr(plain, key)


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.parametrize("techniques", [FSDP, FSDP_AC], ids="+".join)
def test_loss_equals_the_single_process_run(single, sharded, techniques) -> None:
    """Same init, same global batches (each rank its half), averaged gradients: the same losses,
    before and after optimizer steps."""
    for record in sharded[techniques].records:
        assert len(record.memory_losses) == len(single.memory_losses)
        assert record.memory_losses == pytest.approx(single.memory_losses, abs=LOSS_ATOL, rel=0)
        assert record.final_loss == pytest.approx(single.final_loss, abs=LOSS_ATOL, rel=0)


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
        assert value == (max(ranks) if ranks else None), key
    # Rank 1 holds fewer real rows, so less Adam state: rank 0 is the max here.
    assert result.max_over_ranks["optimizer_state_bytes"] == result.records[0].optimizer_state_bytes
    assert all(r.host_peak_bytes and r.host_peak_bytes > 0 for r in result.records)
    decoded = __import__("json").loads(result.to_json())
    assert decoded["devices"] == WORLD and len(decoded["ranks"]) == WORLD


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
    from memclaims.errors import UsageError

    options = RunOptions(device="cpu", evaluate=False)
    with pytest.raises(UsageError, match="not sharded"):
        run_distributed(resolve("vit", "smoke", []), options, 2)
    with pytest.raises(UsageError, match="needs --device cuda"):
        run_distributed(resolve("vit", "smoke", ["fsdp", "cpu-offload"]), options, 2)
    with pytest.raises(UsageError, match="does not split evenly"):
        run_distributed(resolve("vit", "smoke", FSDP), options, 3)
    with pytest.raises(UsageError, match="run_distributed"):
        run(resolve("vit", "smoke", FSDP), options)


# --- GPU: the article's numbers ---------------------------------------------------------------

ARTICLE_GPUS = 4


def needs_cuda(count: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(torch.cuda.device_count() < count, reason=f"needs {count} CUDA device{'s' if count > 1 else ''}")


def _gpu_rank0(techniques: tuple[str, ...], devices: int) -> dict:
    result = run_distributed(resolve("vit", "article", techniques), RunOptions(device="cuda", evaluate=False),
                             devices)
    return result.rank0


@pytest.fixture(scope="module")
def gpu_chain() -> dict[tuple[str, ...], dict]:
    """Single-GPU fp32 (01-2), then 08, 09 and 11 on 4 GPUs, rank 0 as the article printed it."""
    single_gpu = run(resolve("vit", "article", []), RunOptions(device="cuda", evaluate=False)).to_dict()
    chain = {(): single_gpu}
    for techniques in (FSDP_AC, FSDP_AC + ("cpu-offload",), FSDP_AC + ("cpu-offload", "delayed-init")):
        chain[techniques] = _gpu_rank0(techniques, ARTICLE_GPUS)
    return chain


@pytest.mark.dist
@pytest.mark.gpu
@needs_cuda(ARTICLE_GPUS)
def test_gpu_fsdp_with_checkpointing_below_single_gpu_peak(gpu_chain) -> None:
    """Article: 26.84 GB on one GPU -> 6.59 GB per GPU with FSDP + activation checkpointing on 4."""
    assert gpu_chain[FSDP_AC]["peak_reserved_total_bytes"] < gpu_chain[()]["peak_reserved_total_bytes"]


@pytest.mark.dist
@pytest.mark.gpu
@needs_cuda(ARTICLE_GPUS)
def test_gpu_cpu_offload_lowers_gpu_peak_raises_host_memory_and_time(gpu_chain) -> None:
    """Article: 6.59 -> 6.03 GB, 5.53 -> 8.34 min."""
    plain, offload = gpu_chain[FSDP_AC], gpu_chain[FSDP_AC + ("cpu-offload",)]
    assert offload["peak_reserved_total_bytes"] < plain["peak_reserved_total_bytes"]
    assert offload["host_peak_bytes"] > plain["host_peak_bytes"]
    assert offload["step_time_s"] > plain["step_time_s"]


@pytest.mark.dist
@pytest.mark.gpu
@needs_cuda(ARTICLE_GPUS)
def test_gpu_delayed_init_changes_nothing(gpu_chain) -> None:
    """Article (logs of 11): 6.03 -> 6.03 GB."""
    before = gpu_chain[FSDP_AC + ("cpu-offload",)]["peak_reserved_total_bytes"]
    after = gpu_chain[FSDP_AC + ("cpu-offload", "delayed-init")]["peak_reserved_total_bytes"]
    assert after == pytest.approx(before, rel=0.02)


@pytest.mark.dist
@pytest.mark.gpu
@needs_cuda(1)
def test_gpu_cpu_offload_runs_on_one_gpu() -> None:
    result = run_distributed(resolve("vit", "smoke", FSDP_AC + ("cpu-offload",)),
                             RunOptions(device="cuda", evaluate=False), 1)
    assert len(result.records) == 1 and not result.records[0].nan_loss


@pytest.mark.cpu
def test_cuda_strategy_is_the_articles() -> None:
    """Scripts 08/09: auto-wrap and checkpoint EncoderBlock, offload parameters. Only the
    configuration can be checked without GPUs (Lightning's private attributes, read-only)."""
    from torchvision.models.vision_transformer import EncoderBlock

    offload = distributed.fsdp_strategy(resolve("vit", "smoke", FSDP_AC + ("cpu-offload",)))
    assert offload._fsdp_kwargs["auto_wrap_policy"]._module_classes == {EncoderBlock}
    assert offload._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {EncoderBlock}
    assert offload.cpu_offload.offload_params
    plain = distributed.fsdp_strategy(resolve("vit", "smoke", FSDP))
    assert not plain.cpu_offload.offload_params and not plain._activation_checkpointing_kwargs
