"""Progress of a spawned rank, told to the launcher that waits on it: a run's limit counts from a rank's
last beat, not from its start, so a loaded machine that runs slowly is never stopped and a stalled rank is.

Hand-written: torch.distributed's elastic agent watches whole workers' heartbeats, not progress inside
one, and it is not what spawns memclaims' ranks (memclaims.measure.launcher).
"""

from __future__ import annotations

import os
import time

# The file a spawned rank touches on progress (its mtime is the rank's last beat), set by the launcher.
HEARTBEAT_ENV = "MEMCLAIMS_RANK_HEARTBEAT"
BEAT_EVERY_S = 0.5  # at most one touch per half second: a step's phases cost no system call beyond it
_last = 0.0


def beat() -> None:
    """Progress on this rank (every measured phase begins and ends with one). Does nothing outside a
    spawned rank."""
    global _last
    path = os.environ.get(HEARTBEAT_ENV)
    now = time.monotonic()
    if path is None or now - _last < BEAT_EVERY_S:
        return
    _last = now
    try:
        os.utime(path)
    except OSError:  # the parent has gone and taken the folder with it: nothing left to tell
        pass
