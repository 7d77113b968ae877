"""delayed-init: the model built inside ``fabric.init_module(empty_init=False)`` under FSDP (article 11,
logs only). The CUDA FSDP rank's Fabric engine builds through ``init_context``; the CPU ranks and the sim's
FSDP replay read the entry's flag (they build the model themselves)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from memclaims.techniques.base import Hooks, Technique


class DelayedInit(Hooks):
    def init_context(self, engine: Any) -> AbstractContextManager[Any] | None:
        return engine.fabric.init_module(empty_init=False)  # type: ignore[no-any-return]


ENTRY = Technique("delayed-init", "model built inside fabric.init_module(empty_init=False) under FSDP",
                  "11_delay-allocation (logs only)", delayed_init=True, needs=frozenset({"fsdp"}), hooks=DelayedInit())
