"""The caching-allocator model's arithmetic, on small hand-computed cases."""

from __future__ import annotations

import pytest

from memclaims.sim.allocator import AllocatorConfig, CachingAllocator, DeviceFull, MiB, TraceEvent

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


def test_at_its_limit_the_allocator_frees_whole_cached_segments_and_retries():
    # torch's malloc: when cudaMalloc fails, release_cached_blocks() returns every cached segment that
    # is wholly free (both pools, every stream) and the segment is asked for once more.
    allocator = CachingAllocator(AllocatorConfig(), limit_bytes=100 * MiB)
    allocator.events = []
    kept = allocator.malloc(30 * MiB)
    for handle in [allocator.malloc(30 * MiB), allocator.malloc(100), allocator.malloc(20 * MiB, stream=1)]:
        allocator.free(handle)
    assert allocator.stats.reserved == 82 * MiB
    allocator.malloc(40 * MiB)  # 82 + 40 > 100: the free 30, 2 and 20 MiB segments go back
    stats = allocator.stats
    assert (stats.reserved, stats.alloc_retries, stats.segments_released) == (70 * MiB, 1, 3)
    assert stats.reserved_high_water == 82 * MiB  # max_memory_reserved: the peak before the release
    assert sorted(e.size for e in allocator.events if e.action == "segment_free") == [2 * MiB, 20 * MiB, 30 * MiB]
    assert allocator.events[-2] == TraceEvent("segment_alloc", 82 * MiB, 40 * MiB, 0)  # addresses never reused
    allocator.free(kept)
    allocator.malloc(30 * MiB)  # reuses the freed 30 MiB block: no new segment, no retry
    assert (stats.reserved, stats.alloc_retries) == (70 * MiB, 1)


def test_a_segment_still_past_the_limit_fails_and_split_segments_stay():
    allocator = CachingAllocator(AllocatorConfig(), limit_bytes=60 * MiB)
    first = allocator.malloc(5 * MiB)  # a 20 MiB segment, shared by both 5 MiB requests
    other = allocator.malloc(5 * MiB)
    allocator.free(first)  # free blocks before and after a live one: the segment is not wholly free
    allocator.free(allocator.malloc(12 * MiB))  # a segment of its own, wholly free: released at the retry
    with pytest.raises(DeviceFull) as failed:
        allocator.malloc(45 * MiB)  # a 46 MiB segment: 20 + 46 > 60
    assert (failed.value.requested, failed.value.segment, failed.value.reserved, failed.value.limit) == (
        45 * MiB, 46 * MiB, 20 * MiB, 60 * MiB)
    assert "after freeing every wholly free cached segment" in str(failed.value)
    assert allocator.is_live(other) and allocator.stats.alloc_retries == 1
    assert allocator.free_blocks(small=False) == [(5 * MiB, 0, 0), (10 * MiB, 0, 10 * MiB)]


def test_without_a_limit_nothing_is_released():
    allocator = fresh()
    for _ in range(3):
        allocator.free(allocator.malloc(30 * MiB))
        allocator.malloc(40 * MiB)
    assert allocator.stats.segments_released == allocator.stats.alloc_retries == 0
    assert allocator.stats.reserved == allocator.stats.reserved_high_water == 150 * MiB


def expandable() -> CachingAllocator:
    return CachingAllocator(AllocatorConfig(expandable_segments=True))


def test_expandable_segments_grow_one_range_for_growing_requests():
    """The docs' case (a changing batch size): each request a little larger than the last. The
    default allocator gets a segment per size (30 + 50 + 70 MiB); the expandable segment maps only the
    20 MiB pages the free tail lacks (40, then 20, then 20)."""
    default, grown = fresh(), expandable()
    for allocator in (default, grown):
        for size in (30 * MiB, 50 * MiB, 70 * MiB):
            allocator.free(allocator.malloc(size))
    assert default.stats.reserved == 150 * MiB and default.stats.segments == 3
    assert grown.stats.reserved == 80 * MiB and grown.stats.segments == 1
    assert grown.stats.allocated == 0 and grown.free_blocks(small=False) == [(80 * MiB, 0, 0)]


def test_expandable_segments_map_pages_of_2_and_20_mib_and_split_any_remainder():
    allocator = expandable()
    allocator.malloc(100)  # small pool: one 2 MiB page
    assert allocator.stats.reserved == 2 * MiB
    a = allocator.malloc(MiB + 512)  # large pool: one 20 MiB page
    assert allocator.stats.reserved == 22 * MiB
    allocator.malloc(19 * MiB - 1024)  # 512 B remain: split (the default keeps rests of 1 MiB or less whole)
    assert allocator.free_blocks(small=False) == [(512, 1, 20 * MiB - 512)]
    allocator.free(a)  # merges with nothing (its neighbour is live): two free blocks
    assert sorted(size for size, _, _ in allocator.free_blocks(small=False)) == [512, MiB + 512]


def test_expandable_segments_are_per_stream_and_pool():
    allocator = expandable()
    allocator.free(allocator.malloc(30 * MiB, stream=0))
    allocator.malloc(30 * MiB, stream=1)  # the free 40 MiB of stream 0 are not stream 1's
    assert allocator.stats.reserved == 80 * MiB and allocator.stats.segments == 2


def test_expandable_segments_at_a_limit_unmap_the_free_tail_and_retry():
    allocator = expandable()
    allocator.limit_bytes = 100 * MiB
    live = allocator.malloc(30 * MiB)
    allocator.free(allocator.malloc(50 * MiB))  # mapped 40 + 40 = 80 MiB, the tail 50 MiB free
    events: list[TraceEvent] = []
    allocator.events = events
    allocator.malloc(30 * MiB, stream=1)  # 40 MiB more would pass 100: the tail's whole pages go back
    assert allocator.stats.alloc_retries == 1
    assert events[0] == TraceEvent("segment_unmap", 40 * MiB, 40 * MiB, 0)
    assert allocator.stats.reserved == 40 * MiB + 40 * MiB
    assert allocator.is_live(live)
    with pytest.raises(DeviceFull):
        allocator.malloc(30 * MiB, stream=2)
