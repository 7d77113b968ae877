"""Host memory per step phase: what the process gained in each phase of each measured step.

Two counters, read at the start and the end of every step phase (``memclaims.measure.loop.STEP_PHASES``):

- ``rss_bytes``: the resident set (psutil). On the cpu tier it also holds the tensors, but glibc
  keeps freed heap resident and reuses it, so from the second step on the level repeats within the
  noise measured in ``memclaims.measure.host_steady``. The same reuse hides a leak that fits in
  freed heap: an 8 MiB ``bytearray`` kept per step moved it by 8 MiB in most runs and by nothing in
  some (CI, torch 2.9.1), so no test relies on it; glibc's ``mallinfo2`` (bytes in use) would not
  have that blind spot.
- ``python_blocks``: ``sys.getallocatedblocks()``, the blocks Python's small-object allocator holds:
  one per small object, exact and O(1). A few thousand small objects kept per step (tuples, dicts)
  are under the RSS noise but move it by thousands, while an identical step moves it by tens.

Not chosen: ``len(gc.get_objects())`` walks every tracked object (184,000 after importing the
libraries, 96 ms per read here; 8 reads a step) and misses untracked ones (strings, floats);
``tracemalloc`` hooks every allocation of the run (its cost was not measured: the two counters
above already catch both kinds of leak the regression tests inject).

Per occurrence of a phase (forward and backward once per micro-batch) the Record keeps what the phase
``gained`` (signed: a phase that frees what an earlier one allocated gains a negative number) and the
``level`` at its end, relative to the start of the first measured step. Gains say where a step puts
host memory; levels say whether the process grows from step to step (between phases too: the cpu
probe frees MemTracker's per-module statistics between steps), which ``memclaims.measure.host_steady``
judges.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from memclaims.measure.loop import PhaseCallback

RSS = "rss_bytes"
PYTHON_BLOCKS = "python_blocks"
COUNTERS = (RSS, PYTHON_BLOCKS)


def _rss() -> int:
    import psutil  # type: ignore[import-untyped]  # no stubs in the environment; one call

    return int(psutil.Process().memory_info().rss)


def read_counters() -> dict[str, int]:
    # Reference cycles (autograd nodes and the closures of hooks on them) are garbage the moment
    # the graph is freed, but the cyclic collector takes them whenever its thresholds say: counted
    # uncollected they grew a clean vit-smoke step by about 1,600 blocks. A collection here finds
    # only them: ``HostSteps.frozen`` froze everything older, which makes it cheap.
    gc.collect()
    return {RSS: _rss(), PYTHON_BLOCKS: sys.getallocatedblocks()}


GAINED, LEVEL = "gained", "level"


class HostSteps:
    """Wraps a loop's phase callback; ``steps[counter][phase]`` holds each occurrence's ``gained``
    and ``level`` (the Record's ``host_steps``)."""

    def __init__(self, read: Callable[[], dict[str, int]] = read_counters) -> None:
        self.read = read
        self.steps: dict[str, dict[str, dict[str, list[int]]]] = {}
        self._origin: dict[str, int] | None = None

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Around the measured steps: what exists before them is moved to the collector's permanent
        generation (``gc.freeze``), so that each read's collection scans only the steps' own objects."""
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()

    def wrap(self, phase: PhaseCallback) -> PhaseCallback:
        @contextmanager
        def measured(name: str) -> Iterator[Any]:
            # Read inside the probe's phase: what the probe allocates at its own boundaries
            # (MemTracker's snapshots) is not the phase's.
            with phase(name) as inner:
                before = self.read()
                yield inner
                after = self.read()
            origin = self._origin = self._origin or before
            for counter, value in after.items():
                entry = self.steps.setdefault(counter, {}).setdefault(name, {GAINED: [], LEVEL: []})
                entry[GAINED].append(value - before[counter])
                entry[LEVEL].append(value - origin[counter])

        return measured
