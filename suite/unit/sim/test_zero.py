"""DeepSpeed ZeRO-2's per-rank accounting (memclaims.sim.replays.zero) in exact bytes on a small config."""

from __future__ import annotations

import pytest

from memclaims.sim.replays.zero import LIGHTNING_DEFAULTS, Zero2Config, Zero2Terms, partition_numel, zero2_rank_bytes

pytestmark = pytest.mark.sim


def test_zero2_terms_in_exact_bytes() -> None:
    # 1,001 parameters on 4 ranks: the flat group is padded to 2 x 4 = 8 elements (1,008), 252 per rank.
    assert partition_numel(1001, 4) == 252
    terms = zero2_rank_bytes(1001, activations=123, config=Zero2Config(world=4, reduce_bucket_size=100))
    assert terms == Zero2Terms(
        fp16_model=1008 * 2,  # the whole padded fp16 flat group on every rank
        fp32_master=252 * 4,  # this rank's fp32 slice
        adam_states=2 * 252 * 4,  # exp_avg + exp_avg_sq over the slice
        fp32_grad_partition=252 * 4,
        reduce_buckets=2 * 100 * 2,  # overlap_comm: two fp16 ipg buffers of reduce_bucket_size elements
        activations=123,
    )
    assert terms.total == 2016 + 1008 + 2016 + 1008 + 400 + 123


def test_zero2_buckets_follow_overlap_comm_and_contiguous_gradients() -> None:
    one = zero2_rank_bytes(1000, 0, Zero2Config(world=4, reduce_bucket_size=100, overlap_comm=False))
    none = zero2_rank_bytes(1000, 0, Zero2Config(world=4, reduce_bucket_size=100, contiguous_gradients=False))
    assert (one.reduce_buckets, none.reduce_buckets) == (200, 0)


def test_lightning_defaults_as_read() -> None:
    # lightning/fabric/strategies/deepspeed.py, DeepSpeedStrategy.__init__ (Fabric 2.0 of mid-2023 and 2.6).
    assert (LIGHTNING_DEFAULTS.world, LIGHTNING_DEFAULTS.reduce_bucket_size, LIGHTNING_DEFAULTS.allgather_bucket_size,
            LIGHTNING_DEFAULTS.overlap_comm, LIGHTNING_DEFAULTS.contiguous_gradients) == (
        4, 200_000_000, 200_000_000, True, True)
    assert zero2_rank_bytes(0, 0).reduce_buckets == 800_000_000  # 2 x 2e8 fp16 elements, whatever the model
