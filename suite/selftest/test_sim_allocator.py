"""The caching-allocator model's arithmetic, on small hand-computed cases."""

from __future__ import annotations

import pytest

from memclaims.sim.allocator import AllocatorConfig, CachingAllocator, MiB

pytestmark = pytest.mark.sim


def fresh() -> CachingAllocator:
    return CachingAllocator(AllocatorConfig())


@pytest.mark.parametrize("size, rounded", [(1, 512), (511, 512), (512, 512), (513, 1024), (4097, 4608)])
def test_rounding_to_512(size, rounded):
    assert AllocatorConfig().round_size(size) == rounded


@pytest.mark.parametrize("size, segment", [
    (512, 2 * MiB), (MiB, 2 * MiB),  # small pool
    (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),  # 1-10 MiB: 20 MiB segments
    (10 * MiB, 10 * MiB), (11 * MiB + 1, 12 * MiB),  # larger: own segment rounded to 2 MiB
])
def test_segment_sizes(size, segment):
    config = AllocatorConfig()
    assert config.segment_size(config.round_size(size)) == segment


def test_zero_bytes_allocate_nothing():
    allocator = fresh()
    assert allocator.malloc(0) == 0
    allocator.free(0)
    assert allocator.stats.reserved == 0


def test_small_requests_share_a_2_mib_segment():
    allocator = fresh()
    a = allocator.malloc(100)
    allocator.malloc(1000)
    assert allocator.stats.reserved == 2 * MiB
    assert allocator.stats.allocated == 512 + 1024
    assert allocator.stats.requested == 1100
    allocator.free(a)
    assert allocator.stats.allocated == 1024
    # The freed 512 B block is the best fit for another small request: no new segment.
    allocator.malloc(300)
    assert allocator.stats.reserved == 2 * MiB


def test_small_and_large_pools_are_separate():
    allocator = fresh()
    allocator.malloc(MiB)  # small pool: a 2 MiB segment
    allocator.malloc(MiB + 1)  # large pool: a 20 MiB segment
    assert allocator.stats.reserved == 22 * MiB
    assert allocator.stats.segments == 2


def test_large_split_keeps_remainder_and_merges_back():
    allocator = fresh()
    a = allocator.malloc(2 * MiB)  # 20 MiB segment, split: 2 MiB used, 18 MiB free
    assert allocator.free_blocks(small=False) == [(18 * MiB, 0, 2 * MiB)]
    b = allocator.malloc(3 * MiB)  # best fit: the 18 MiB rest, split again
    assert allocator.free_blocks(small=False) == [(15 * MiB, 0, 5 * MiB)]
    assert allocator.stats.reserved == 20 * MiB
    allocator.free(a)
    assert allocator.free_blocks(small=False) == [(2 * MiB, 0, 0), (15 * MiB, 0, 5 * MiB)]
    allocator.free(b)  # merges with both free neighbours into the whole segment
    assert allocator.free_blocks(small=False) == [(20 * MiB, 0, 0)]
    assert allocator.stats.allocated == 0
    assert allocator.stats.reserved == 20 * MiB  # nothing is returned


def test_large_remainder_of_1_mib_or_less_is_not_split():
    allocator = fresh()
    allocator.malloc(19 * MiB)  # rest of the 20 MiB segment is exactly 1 MiB: not worth a block
    assert allocator.free_blocks(small=False) == []
    assert allocator.stats.allocated == 20 * MiB  # the whole block counts as allocated


def test_best_fit_picks_the_smallest_block_that_fits():
    allocator = fresh()
    big = allocator.malloc(12 * MiB)  # own 12 MiB segment (0)
    small = allocator.malloc(10 * MiB)  # own 10 MiB segment (1)
    allocator.free(big)
    allocator.free(small)
    allocator.malloc(10 * MiB)  # fits both; takes the 10 MiB block exactly
    assert allocator.free_blocks(small=False) == [(12 * MiB, 0, 0)]
    allocator.malloc(11 * MiB)  # takes 12 MiB (remainder 1 MiB: no split)
    assert allocator.stats.reserved == 22 * MiB
    assert allocator.stats.allocated == 22 * MiB


def test_reserved_never_shrinks_and_peaks_reset_to_current():
    allocator = fresh()
    handles = [allocator.malloc(30 * MiB) for _ in range(3)]
    for handle in handles:
        allocator.free(handle)
    assert allocator.stats.reserved == allocator.stats.peak_reserved == 90 * MiB
    assert allocator.stats.peak_allocated == 90 * MiB and allocator.stats.allocated == 0
    allocator.reset_peaks()
    assert allocator.stats.peak_allocated == 0
    assert allocator.stats.peak_reserved == 90 * MiB
    allocator.malloc(60 * MiB)  # no 60 MiB free block (segments never merge): a new segment
    assert allocator.stats.reserved == 150 * MiB


def test_small_pool_split_keeps_512_byte_remainders():
    allocator = fresh()
    a = allocator.malloc(2 * MiB - 512)  # a small request? no: > 1 MiB goes to the large pool
    assert allocator.stats.reserved == 20 * MiB
    allocator.free(a)
    b = allocator.malloc(MiB)  # small pool: 2 MiB segment, 1 MiB rest kept
    assert allocator.free_blocks(small=True) == [(MiB, 1, MiB)]
    c = allocator.malloc(MiB - 512)  # leaves exactly 512 B: still split in the small pool
    assert allocator.free_blocks(small=True) == [(512, 1, 2 * MiB - 512)]
    allocator.free(b)
    allocator.free(c)
    assert allocator.free_blocks(small=True) == [(2 * MiB, 1, 0)]


def test_streams_do_not_share_free_blocks():
    allocator = fresh()
    a = allocator.malloc(30 * MiB, stream=1)
    allocator.free(a)
    allocator.malloc(30 * MiB, stream=0)  # the freed block belongs to stream 1: a new segment
    assert allocator.stats.reserved == 60 * MiB
    assert allocator.free_blocks(small=False, stream=1) == [(30 * MiB, 0, 0)]
    allocator.malloc(30 * MiB, stream=1)  # stream 1 gets its own block back
    assert allocator.stats.reserved == 60 * MiB
