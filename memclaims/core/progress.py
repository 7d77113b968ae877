"""Progress of long work (reproduce's chain, fit's replays, upgrade's candidate, baselines spread): a
tqdm bar on a terminal, nothing in a log. tqdm's ``disable=None`` turns the bar off where stderr is
not a TTY, so a CI log or a redirected run gets no carriage-return noise; the command's own result
lines are printed as before (``say``: above the bar where one is drawn)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def steps(items: Iterable[T], what: str, total: int | None = None) -> Iterator[T]:
    """``items``, with a bar named ``what`` on a terminal; the bar is cleared when the work ends."""
    bar = tqdm(items, desc=what, total=total, disable=None, file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield from bar
    finally:
        bar.close()


def shown() -> bool:
    """Whether a bar would be drawn here (stderr is a terminal)."""
    return sys.stderr.isatty()


def say(text: str) -> None:
    """One line on stderr, printed above a bar being drawn instead of through it."""
    tqdm.write(text, file=sys.stderr)
    sys.stderr.flush()


@contextmanager
def ticking(what: str) -> Iterator[None]:
    """While the body runs (one long step with no count: a run, its ranks), a bar on a terminal that shows the
    seconds elapsed, redrawn each second by a thread; nothing in a log."""
    bar = tqdm(desc=what, total=None, disable=None, file=sys.stderr, leave=False, dynamic_ncols=True,
               bar_format="{desc}: {elapsed}")
    stop = threading.Event()

    def redraw() -> None:
        while not stop.wait(1.0):
            bar.refresh()

    ticker = threading.Thread(target=redraw, daemon=True)
    if not bar.disable:
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
        bar.close()
