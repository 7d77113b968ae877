"""The CUDA caching allocator's settings a recipe asks for (expandable-segments), and what shows them.

torch reads ``PYTORCH_CUDA_ALLOC_CONF`` once; ``torch.cuda.memory._set_allocator_settings`` changes
the setting in a running process, for segments created afterwards (torch's own
``test_cuda_expandable_segments`` switches it this way). So the cache is emptied before (segments of
earlier cases keep their kind) and after (the next case starts with none of this one's), and the
setting goes back to what the environment asked for. ``cuda`` is injectable so that the calls are
tested against a fake on machines without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

ENV = "PYTORCH_CUDA_ALLOC_CONF"


def environment_default() -> bool:
    """Whether the environment turned expandable segments on for the whole process."""
    return "expandable_segments:true" in os.environ.get(ENV, "").replace(" ", "").lower()


@contextmanager
def expandable_segments(on: bool, cuda: Any = None) -> Iterator[None]:
    """Expandable segments for the block's allocations when ``on`` (else nothing changes)."""
    cuda = torch.cuda if cuda is None else cuda
    if not on:
        yield
        return
    cuda.synchronize()
    cuda.empty_cache()
    cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        yield
    finally:
        cuda.synchronize()
        cuda.empty_cache()
        cuda.memory._set_allocator_settings(f"expandable_segments:{environment_default()}")


def expandable_segment_bytes(cuda: Any = None) -> int:
    """Reserved bytes that sit in expandable segments now (the allocator snapshot's ``is_expandable``)."""
    cuda = torch.cuda if cuda is None else cuda
    return sum(int(segment["total_size"]) for segment in cuda.memory_snapshot() if segment.get("is_expandable"))
