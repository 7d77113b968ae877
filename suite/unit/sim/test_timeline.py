"""The sim's clock (memclaims.sim.timeline) and the allocator's frees that wait for other streams (issue #29)."""

from __future__ import annotations

import pytest

from memclaims.sim.allocator import CachingAllocator
from memclaims.sim.timeline import A100_40GB, Clock, Timing, last_step_seconds, ring_seconds

pytestmark = pytest.mark.sim

MB = 10**6


def _clock(depth: int | None = None) -> Clock:
    return Clock(A100_40GB, Timing(dispatch_s=1e-5, queue_depth=depth))


def test_kernels_queue_on_their_stream_while_the_cpu_runs_ahead() -> None:
    clock = _clock()
    assert clock.launch(1.0, stream=0) == pytest.approx(1.00001)
    assert clock.launch(1.0, stream=0) == pytest.approx(2.00001)  # after the first, not at issue time
    assert clock.launch(0.5, stream=1) == pytest.approx(0.50003)  # another stream runs beside them
    assert clock.cpu == pytest.approx(3e-5)  # three launches of CPU time: far ahead of the GPU
    assert clock.event(0) == pytest.approx(2.00001) and clock.event(1) == pytest.approx(0.50003)
    clock.wait_stream(1, 0)
    assert clock.launch(0.5, stream=1) == pytest.approx(2.50001)
    assert clock.synchronize() == pytest.approx(2.50001) == clock.cpu


def test_a_full_launch_queue_blocks_the_cpu_until_the_oldest_kernel_ends() -> None:
    clock = _clock(depth=2)
    for _ in range(3):
        clock.launch(1.0)
    assert clock.cpu == pytest.approx(1.00001)  # the third launch waited for the first to finish
    unbounded = _clock()
    for _ in range(3):
        unbounded.launch(1.0)
    assert unbounded.cpu == pytest.approx(3e-5)


def test_collectives_take_their_ring_time_and_steps_their_difference() -> None:
    assert ring_seconds(4 * 10**9, 4, A100_40GB) == pytest.approx(0.75 * 4 / 300)
    assert ring_seconds(10**9, 1, A100_40GB) == 0.0
    assert last_step_seconds([1.0, 2.5, 4.25]) == pytest.approx(1.75)
    assert last_step_seconds([1.0]) is None


def test_a_free_with_pending_uses_returns_its_block_when_they_have_run() -> None:
    allocator = CachingAllocator()
    handle = allocator.malloc(100 * MB, stream=1)
    reserved = allocator.stats.reserved
    allocator.free(handle, ready_at=2.0)
    assert allocator.stats.allocated == 0  # torch's free: allocated drops at once
    allocator.process_events(1.0)  # the GPU has not run the uses yet: the block stays out of its pool
    again = allocator.malloc(100 * MB, stream=1)
    assert allocator.stats.reserved == 2 * reserved
    allocator.free(again)
    allocator.process_events(2.0)
    allocator.malloc(100 * MB, stream=1)
    allocator.malloc(100 * MB, stream=1)
    assert allocator.stats.reserved == 2 * reserved  # both blocks reused


def test_sharded_frees_wait_for_the_gpu_only_on_the_timeline() -> None:
    """The same FSDP1 recipe with and without the clock: the untimed replay keeps the forward's unsharded
    buffers alive until the first pre-backward hook; the timeline frees them after their unit's forward, their
    blocks waiting for the GPU (their bytes leave ``allocated`` at the free, as torch's do); and only the timed
    replay predicts a step time. (The reserved side is the published table's, at article scale.)"""
    from memclaims.recipes.recipe import resolve
    from memclaims.sim import simulate

    recipe = resolve("vit", "smoke", ["fsdp"])
    timed, untimed = simulate(recipe, profile="article"), simulate(recipe, profile="article-untimed")
    assert timed.predicted_step_s is not None and timed.predicted_step_s > 0
    assert untimed.predicted_step_s is None
    assert timed.peak_allocated_bytes < untimed.peak_allocated_bytes
