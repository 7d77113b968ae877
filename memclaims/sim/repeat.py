"""Repeated micro-batches: replay one's allocations instead of dispatching its ops again.

Between two optimizer steps every micro-batch of a gradient-accumulation window asks the device
for the same sizes, in the same order, and frees them in the same order; only the allocator's
state (which block serves a request) differs from one to the next. Dispatching a micro-batch
through fake tensors costs seconds (BigBird at 4,096 tokens: ~10,000 ops and ~25,000 device
queries); replaying its allocation events through the tracker's primitives costs milliseconds,
and gives the allocator the identical sequence of requests, so every peak comes out as if the ops
had run.

The pattern is checked, not assumed: micro-batches 0 to 2 run and are recorded; 3 to accum (the
last one's forward and backward; its optimizer step always runs) are replayed only when the
records of 1 and 2 agree event for event (a handle named by where it was allocated: this
micro-batch, the one before, or earlier) and nothing micro-batch 1 allocated outlives micro-batch
2. Otherwise every micro-batch runs. After the replays, the tensors still alive from micro-batch 2
take over the handles of the last replayed one, so what runs next frees what a real run would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from memclaims.sim.tracker import DeviceMemory

Event = tuple[Any, ...]
# A handle, relative to the micro-batch that names it: ("here", i) its i-th allocation,
# ("before", i) the previous micro-batch's i-th, ("kept", handle) anything older.
Ref = tuple[str, int]

_ALLOCATING = ("count", "scratch")
_NO_HANDLE = ("launch", "sync")  # the timeline's events: (seconds, stream) and (None,)


class RepeatedMicroBatches:
    """Records micro-batches 0 to 2; replays 3 to accum when 1 and 2 match."""

    def __init__(self, memory: DeviceMemory, accumulation_steps: int) -> None:
        self.memory = memory
        self.replayable = range(3, accumulation_steps + 1)  # empty without accumulation of 3 or more
        # micro-batch -> its allocator handles: [start, end), the optimizer step's not among them
        self.spans: dict[int, range] = {}
        self.records: dict[int, list[Event]] = {}
        self.pattern: list[Event] | None = None  # micro-batch 2's events, relative, once checked
        self.replayed = 0
        self._carried: dict[int, torch.UntypedStorage] = {}  # micro-batch 2's live storages by index
        self._previous: list[int] = []  # the tensor handles of the micro-batch before the one replayed

    @contextmanager
    def running(self, batch_index: int) -> Iterator[None]:
        """Wrap a micro-batch that runs its ops."""
        record = len(self.replayable) > 0 and batch_index in (0, 1, 2)
        start = self.memory.allocator.next_handle
        if record:
            self.memory.trace = []
        try:
            yield
        finally:
            if record:
                self.records[batch_index], self.memory.trace = self.memory.trace or [], None
        self.spans[batch_index] = range(start, self.memory.allocator.next_handle)
        if batch_index == 2 and set(self.records) == {0, 1, 2}:
            self.pattern = self._checked_pattern()

    def replay(self, batch_index: int) -> bool:
        """Replay ``batch_index`` from the checked pattern; False when it must run its ops."""
        if self.pattern is None or batch_index not in self.replayable:
            return False
        if batch_index == self.replayable[0]:
            self._carry()
        self._previous = self._apply(self.pattern, self._previous)
        self.replayed += 1
        if batch_index == self.replayable[-1]:
            self._hand_over()
        return True

    # --- checking ---------------------------------------------------------------------------

    def _relative(self, batch_index: int) -> list[Event] | None:
        """The record of ``batch_index`` with handles relative to it; None if an allocation went unrecorded."""
        span = self.spans[batch_index]
        events = self.records[batch_index]
        if sum(event[0] in _ALLOCATING for event in events) != len(span):
            return None
        before = {handle: index for index, handle in enumerate(self._tensor_handles(batch_index - 1))}

        def ref(handle: int) -> Ref:
            if handle in span:
                return ("here", handle - span.start)
            if handle in before:
                return ("before", before[handle])
            return ("kept", handle)

        return [(kind, handle if kind in _NO_HANDLE else ref(handle), *rest) for kind, handle, *rest in events]

    def _tensor_handles(self, batch_index: int) -> list[int]:
        """The tensor allocations of a recorded micro-batch, in order. Not its scratch: micro-batch 0
        also creates the cuBLAS workspaces, which would shift every index after them."""
        return [event[1] for event in self.records[batch_index] if event[0] == "count"]

    def _checked_pattern(self) -> list[Event] | None:
        first, second = self._relative(1), self._relative(2)
        if first is None or first != second:
            return None
        allocator = self.memory.allocator
        if any(allocator.is_live(handle) for handle in self.spans[1]):
            return None  # something of micro-batch 1 outlived micro-batch 2: not one micro-batch's pattern
        return second

    # --- replaying --------------------------------------------------------------------------

    def _carry(self) -> None:
        """Take micro-batch 2's live storages off their handles: the replay frees those handles."""
        self._previous = self._tensor_handles(2)
        for index, handle in enumerate(self._previous):
            storage = self.memory.detach(handle)
            if storage is not None:
                self._carried[index] = storage

    def _apply(self, pattern: list[Event], previous: list[int]) -> list[int]:
        """Run the pattern's events; the tensor handles it made, in order."""
        memory = self.memory
        made: list[int] = []  # every allocation ("here")
        tensors: list[int] = []  # the tensor allocations ("before", for the next micro-batch)

        def handle(ref: Ref) -> int:
            where, value = ref
            return made[value] if where == "here" else previous[value] if where == "before" else value

        saved = memory.stream, memory.op, memory.in_optimizer
        try:
            for kind, ref, *rest in pattern:
                if kind == "count":
                    nbytes, memory.stream, category, memory.op, memory.in_optimizer = rest
                    made.append(memory.count(nbytes, category))
                    tensors.append(made[-1])
                elif kind == "scratch":
                    made.append(memory.scratch(rest[0]))
                elif kind == "release":
                    memory.release(handle(ref))
                elif kind == "retag":
                    memory.retag(handle(ref), rest[0])
                elif kind == "free_scratch":
                    memory.free_scratch(handle(ref))
                elif kind == "release_after":
                    memory.release_after_uses(handle(ref), rest[0])
                elif kind == "launch":
                    memory.launch(ref, rest[0])  # (seconds, stream): no handle
                elif kind == "sync":
                    memory.synchronize()
                else:
                    memory.note_breakdown()
        finally:
            memory.stream, memory.op, memory.in_optimizer = saved
        return tensors

    def _hand_over(self) -> None:
        """Micro-batch 2's storages now own the last replayed micro-batch's handles."""
        for index, storage in self._carried.items():
            handle = self._previous[index]
            if not self.memory.allocator.is_live(handle):
                raise AssertionError(f"replayed handle {handle} (allocation {index}) is not live at the hand-over")
            self.memory.attach(storage, handle)
        self._carried.clear()
