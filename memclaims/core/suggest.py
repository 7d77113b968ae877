"""'Did you mean' for a name a user typed: the closest valid names (difflib), never the whole list.

One place for every front end's unknown-name message (techniques, workloads, hf model types), so that a typo
reads the same everywhere and a list of thousands of model types is never printed.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close(word: str, choices: Iterable[str], count: int = 3) -> list[str]:
    """The valid names closest to ``word`` (difflib's ratio, 0.6 and over), best first; case is ignored."""
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    return [by_lower[m] for m in difflib.get_close_matches(word.lower(), list(by_lower), n=count, cutoff=0.6)]


def did_you_mean(word: str, choices: Iterable[str], where: str, prefix: str = "") -> str:
    """``; did you mean 'bf16-true'?`` with the closest names, else where the valid names are listed (``where``,
    e.g. ``memclaims list shows them``). ``prefix`` is written before each name shown, not compared (``hf:``)."""
    found = close(word, choices)
    if not found:
        return f"; {where}"
    return f"; did you mean {' or '.join(repr(prefix + n) for n in found)}? ({where})"
