"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``), in Python.

No library models this: torch's own tools (MemTracker, the fake-tensor memory estimators) count
live tensor bytes, never segments, and the published figure is ``max_memory_reserved``, which
depends on segment sizes, block splitting and fragmentation. So this file re-implements the
native allocator's default policy by hand, for one device and one stream:

- every request is rounded up to a multiple of 512 B (zero-byte requests allocate nothing);
- requests up to 1 MiB come from the small pool, which grows by 2 MiB segments;
- requests of 1-10 MiB get a 20 MiB segment of the large pool; larger requests get a segment of
  their own, rounded up to 2 MiB;
- a free block is reused best-fit (smallest block that fits, then lowest address);
- a reused block is split when the rest is worth keeping (>= 512 B in the small pool, > 1 MiB
  in the large one), otherwise the whole block is handed out;
- a freed block merges with free neighbours of its segment;
- nothing is returned to the device (no ``empty_cache``) unless a ``limit_bytes`` is set and a new
  segment would pass it: then, as torch's ``release_cached_blocks`` does when ``cudaMalloc`` fails,
  every cached segment that is wholly free goes back and the segment is asked for once more; if it
  still does not fit, the request fails (``DeviceFull``, torch's ``OutOfMemoryError``). Without a
  limit (the default), reserved memory never shrinks;
- each stream has its own free blocks: a block freed by one stream is never handed to a request
  on another (the native allocator keys its free sets by stream first), so work spread over
  streams (FSDP's all-gathers and reduce-scatters) reserves more than one stream would.

With ``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) each pool of
each stream has one segment, a virtual range that grows: a request no free block fits extends the
segment's free tail (or appends a block) by mapping just enough pages (2 MiB in the small pool,
20 MiB in the large one), and every pool splits a block whenever 512 B or more remain. So freed
blocks of any size merge with their neighbours into one range, and reserved memory stays within a
page of what the live tensors and the free tail need (torch's ``try_allocate_expandable_block`` and
``should_split``). At a limit, only the page-aligned part of each free tail is unmapped (torch
unmaps free pages anywhere; inner holes are not modelled).

With ``events`` set to a list, the model logs what it does in the terms of torch's allocator history
(``segment_alloc``, ``alloc``, ``free_completed``, each with an address, a size and a stream), so its
stream can be compared with a GPU's (``memclaims.gpu.alloc_trace``). Segments get increasing
addresses, as fresh ``cudaMalloc`` calls usually do.

``allocated`` counts block sizes, as ``torch.cuda.memory_allocated`` does; ``requested`` counts
the bytes asked for (live tensor bytes), the figure a CPU-side tensor count gives.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

MiB = 1024 * 1024


class DeviceFull(Exception):
    """A segment did not fit under the allocator's limit, even after the cached segments went back."""

    def __init__(self, requested: int, segment: int, reserved: int, limit: int) -> None:
        self.requested, self.segment, self.reserved, self.limit = requested, segment, reserved, limit
        super().__init__(f"a {requested} B request needs a new {segment / MiB:g} MiB segment; {reserved} B are "
                         f"reserved after freeing every wholly free cached segment, the limit is {limit} B")


class TraceEvent(NamedTuple):
    """One event of an allocator's history, as torch's ``_snapshot()`` names them."""

    action: str  # "segment_alloc", "segment_free", "alloc" or "free_completed"
    addr: int
    size: int  # alloc and free_completed: the bytes requested; segment_*: the segment's bytes
    stream: int


@dataclass(frozen=True)
class AllocatorConfig:
    """The native allocator's constants (torch 2.1 defaults; unchanged through 2.14 by default)."""

    min_block_size: int = 512  # kMinBlockSize: rounding unit
    small_size: int = 1 * MiB  # kSmallSize: largest request served by the small pool
    small_buffer: int = 2 * MiB  # kSmallBuffer: small-pool segment size
    large_buffer: int = 20 * MiB  # kLargeBuffer: segment for requests below min_large_alloc
    min_large_alloc: int = 10 * MiB  # kMinLargeAlloc
    round_large: int = 2 * MiB  # kRoundLarge: rounding of segments for large requests
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

    def round_size(self, size: int) -> int:
        if size < self.min_block_size:
            return self.min_block_size
        return -(-size // self.min_block_size) * self.min_block_size

    def is_small(self, rounded: int) -> bool:
        return rounded <= self.small_size

    def segment_size(self, rounded: int) -> int:
        if rounded <= self.small_size:
            return self.small_buffer
        if rounded < self.min_large_alloc:
            return self.large_buffer
        return -(-rounded // self.round_large) * self.round_large

    def page_size(self, small: bool) -> int:
        """The granularity an expandable segment maps memory in."""
        return self.small_buffer if small else self.large_buffer

    def should_split(self, block_size: int, rounded: int) -> bool:
        remaining = block_size - rounded
        if self.is_small(rounded) or self.expandable_segments:
            return remaining >= self.min_block_size
        return remaining > self.small_size


@dataclass(eq=False)
class Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    stream: int = 0
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        # The native free sets order by (stream, size, address); segments stand in for addresses
        # (streams have separate lists here).
        return (self.size, self.segment, self.offset)


@dataclass
class Stats:
    allocated: int = 0
    reserved: int = 0
    requested: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_requested: int = 0
    segments: int = 0  # created, including any released since
    # torch.cuda.max_memory_reserved() with no reset_peak_memory_stats(): the article's figure.
    reserved_high_water: int = 0
    alloc_retries: int = 0  # torch's num_alloc_retries: segments asked for again after freeing the cache
    segments_released: int = 0


@dataclass
class CachingAllocator:
    config: AllocatorConfig = field(default_factory=AllocatorConfig)
    # Bytes the allocator can get from the device (the card's memory less what lies outside the
    # allocator: the CUDA context); None: unlimited.
    limit_bytes: int | None = None

    def __post_init__(self) -> None:
        self.stats = Stats()
        # Free blocks per pool, kept sorted by Block.key (bisect on a parallel key list).
        self._free_keys: dict[tuple[int, bool], list[tuple[int, int, int]]] = {}
        self._free_blocks: dict[tuple[int, bool], list[Block]] = {}
        self._live: dict[int, Block] = {}
        self._next_handle = 1
        self._segment_addresses: list[int] = []  # by segment index
        self._next_address = 0
        self.events: list[TraceEvent] | None = None
        # expandable_segments: the last mapped block of each pool's one segment, per (stream, small).
        self._tails: dict[tuple[int, bool], Block] = {}
        # Blocks freed with pending stream uses: (GPU time they are done, handle, block), a heap.
        self._outstanding: list[tuple[float, int, Block]] = []

    # --- public -----------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocate ``nbytes`` on ``stream``; returns a handle for ``free`` (0 for a zero-byte request)."""
        if nbytes <= 0:
            return 0
        cfg = self.config
        rounded = cfg.round_size(nbytes)
        small = cfg.is_small(rounded)
        block = self._take_free(stream, small, rounded)
        if block is None and cfg.expandable_segments:
            block = self._expand(nbytes, rounded, stream, small)
        elif block is None:
            size = cfg.segment_size(rounded)
            if self.limit_bytes is not None and self.stats.reserved + size > self.limit_bytes:
                self.process_events(float("inf"))  # synchronize_and_free_events: wait for every pending use
                self._release_cached()
                self.stats.alloc_retries += 1
                if self.stats.reserved + size > self.limit_bytes:
                    raise DeviceFull(nbytes, size, self.stats.reserved, self.limit_bytes)
            block = Block(segment=self.stats.segments, offset=0, size=size, small=small, stream=stream)
            self._segment_addresses.append(self._next_address)
            self._next_address += block.size
            self.stats.segments += 1
            self.stats.reserved += block.size
            if self.events is not None:
                self.events.append(TraceEvent("segment_alloc", self._address(block), block.size, stream))
        if cfg.should_split(block.size, rounded):
            rest = Block(segment=block.segment, offset=block.offset + rounded, size=block.size - rounded,
                         small=small, prev=block, next=block.next, stream=block.stream)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            if self._tails.get((block.stream, small)) is block:
                self._tails[(block.stream, small)] = rest
            self._insert_free(rest)
        block.free = False
        block.requested = nbytes
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = block
        s = self.stats
        s.allocated += block.size
        s.requested += nbytes
        s.peak_allocated = max(s.peak_allocated, s.allocated)
        s.peak_reserved = max(s.peak_reserved, s.reserved)
        s.reserved_high_water = max(s.reserved_high_water, s.reserved)
        s.peak_requested = max(s.peak_requested, s.requested)
        if self.events is not None:
            self.events.append(TraceEvent("alloc", self._address(block), nbytes, stream))
        return handle

    def free(self, handle: int, ready_at: float | None = None) -> None:
        """Free ``handle``. ``ready_at``: the block has uses on other streams (``record_stream``); its bytes stop
        counting as allocated now, but it returns to its pool only at the first ``process_events`` at or after
        that GPU time (torch's ``insert_events``, then ``process_events`` on a later ``malloc``)."""
        if handle == 0:
            return
        block = self._live.pop(handle)
        self.stats.allocated -= block.size
        self.stats.requested -= block.requested
        if ready_at is not None:
            heapq.heappush(self._outstanding, (ready_at, handle, block))
            return
        self._return(block)

    def process_events(self, now: float) -> None:
        """Return every block whose pending stream uses have finished by GPU time ``now`` to its pool."""
        while self._outstanding and self._outstanding[0][0] <= now:
            self._return(heapq.heappop(self._outstanding)[2])

    def _return(self, block: Block) -> None:
        if self.events is not None:
            self.events.append(TraceEvent("free_completed", self._address(block), block.requested, block.stream))
        block.free, block.requested = True, 0
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove_free(neighbour)
                merged = self._merge(block, neighbour)
                key = (merged.stream, merged.small)
                if self._tails.get(key) in (block, neighbour):
                    self._tails[key] = merged
                block = merged
        self._insert_free(block)

    @property
    def next_handle(self) -> int:
        """The handle the next allocation gets: handles count up from 1, one per allocation."""
        return self._next_handle

    @property
    def expandable_bytes(self) -> int:
        """Bytes mapped in expandable segments (each mapped from its start to its last block)."""
        return sum(tail.offset + tail.size for tail in self._tails.values())

    def is_live(self, handle: int) -> bool:
        return handle in self._live

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats``: peaks restart from the current values."""
        s = self.stats
        s.peak_allocated, s.peak_reserved, s.peak_requested = s.allocated, s.reserved, s.requested

    def free_blocks(self, small: bool, stream: int = 0) -> list[tuple[int, int, int]]:
        """(size, segment, offset) of the free blocks of one pool, for tests and debugging."""
        return list(self._free_keys.get((stream, small), []))

    # --- internals --------------------------------------------------------------------------

    def _address(self, block: Block) -> int:
        return self._segment_addresses[block.segment] + block.offset

    def _expand(self, nbytes: int, rounded: int, stream: int, small: bool) -> Block:
        """A request no free block fits, with expandable segments: map the pages it needs at the end
        of its pool's segment, growing the free tail block or appending a block after the last."""
        page = self.config.page_size(small)
        tail = self._tails.get((stream, small))
        have = tail.size if tail is not None and tail.free else 0
        mapped = -(-(rounded - have) // page) * page
        if self.limit_bytes is not None and self.stats.reserved + mapped > self.limit_bytes:
            self._release_cached()
            self.stats.alloc_retries += 1
            tail = self._tails.get((stream, small))
            have = tail.size if tail is not None and tail.free else 0
            mapped = -(-(rounded - have) // page) * page
            if self.stats.reserved + mapped > self.limit_bytes:
                raise DeviceFull(nbytes, mapped, self.stats.reserved, self.limit_bytes)
        if tail is None:  # the pool's first request: its segment, a virtual range as large as a device
            self._segment_addresses.append(self._next_address)
            self._next_address += 2**40
            self.stats.segments += 1
            block = Block(segment=self.stats.segments - 1, offset=0, size=mapped, small=small, stream=stream)
        elif tail.free:
            self._remove_free(tail)
            block = tail
            block.size += mapped
        else:
            block = Block(segment=tail.segment, offset=tail.offset + tail.size, size=mapped, small=small,
                          stream=stream, prev=tail)
            tail.next = block
        self._tails[(stream, small)] = block
        self.stats.reserved += mapped
        if self.events is not None:
            self.events.append(TraceEvent("segment_map", self._address(block) + block.size - mapped, mapped, stream))
        return block

    def _release_cached(self) -> None:
        """torch's ``release_cached_blocks``: every free block that is a whole segment goes back;
        with expandable segments, the whole pages of each free tail are unmapped."""
        for (stream, small), tail in list(self._tails.items()):
            if not tail.free:
                continue
            page = self.config.page_size(small)
            keep = -(-tail.offset // page) * page - tail.offset  # up to the first page boundary
            if tail.size <= keep:
                continue
            self._remove_free(tail)
            unmapped = tail.size - keep
            self.stats.reserved -= unmapped
            if self.events is not None:
                self.events.append(TraceEvent("segment_unmap", self._address(tail) + keep, unmapped, stream))
            tail.size = keep
            if keep:
                self._insert_free(tail)
            elif tail.prev is not None:
                tail.prev.next = None
                self._tails[(stream, small)] = tail.prev
            else:
                del self._tails[(stream, small)]
        for blocks in self._free_blocks.values():
            whole = [b for b in blocks if b.prev is None and b.next is None]
            for block in whole:
                self._remove_free(block)
                self.stats.reserved -= block.size
                self.stats.segments_released += 1
                if self.events is not None:
                    self.events.append(TraceEvent("segment_free", self._address(block), block.size, block.stream))

    def _take_free(self, stream: int, small: bool, rounded: int) -> Block | None:
        keys = self._free_keys.setdefault((stream, small), [])
        blocks = self._free_blocks.setdefault((stream, small), [])
        index = bisect.bisect_left(keys, (rounded, -1, -1))
        if index == len(keys):
            return None
        block = blocks[index]
        del keys[index], blocks[index]
        return block

    def _insert_free(self, block: Block) -> None:
        keys = self._free_keys.setdefault((block.stream, block.small), [])
        index = bisect.bisect_left(keys, block.key)
        keys.insert(index, block.key)
        self._free_blocks.setdefault((block.stream, block.small), []).insert(index, block)

    def _remove_free(self, block: Block) -> None:
        keys = self._free_keys[(block.stream, block.small)]
        index = bisect.bisect_left(keys, block.key)
        del keys[index], self._free_blocks[(block.stream, block.small)][index]

    @staticmethod
    def _merge(block: Block, neighbour: Block) -> Block:
        first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first
