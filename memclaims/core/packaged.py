"""The files memclaims ships inside its package (``memclaims/resources/``), for the library to read.

Read through ``importlib.resources``, so that they are found wherever memclaims is installed: a
checkout, an editable install, a wheel. Each file has one reader, in the module that owns its
meaning:

- ``published.json``: the two seed documents' logged tables (``memclaims.core.published.data``);
- ``sources/<document>.json``: the claims, one file per quoted source (``memclaims.core.published.data``);
- ``tolerances.json``: the measured noise of a numerics change and the "keeps accuracy" claims'
  tolerances, written by ``memclaims baselines spread`` (``memclaims.baselines.store.read_tolerances``);
- ``tested_versions.json``: the range of the stack this memclaims was tested with
  (``memclaims.core.tested_versions.table``).

Measured baselines are not here: they are the user's, ``<baselines-dir>/measured/<env>.json``.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from memclaims.core.errors import UsageError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PUBLISHED = "published.json"
TOLERANCES = "tolerances.json"
TESTED_VERSIONS = "tested_versions.json"
SOURCES = "sources"  # a folder: one file of claims per quoted source (memclaims.core.published.data)
NAMES = (PUBLISHED, TOLERANCES, TESTED_VERSIONS, SOURCES)


def resource(name: str) -> Traversable:
    """The packaged file ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise UsageError(f"memclaims ships no file {name!r}; its files: {', '.join(NAMES)}")
    return files("memclaims") / "resources" / name


def output_path(name: str, out: str | os.PathLike[str] | None, command: str) -> Path:
    """Where a generator (``python -m memclaims.claims.accuracy``, ``memclaims baselines spread``) writes
    ``name``: ``out`` when given; else the packaged file itself, where memclaims runs from a writable
    folder (a checkout, an editable install); else a one-line UsageError asking for ``--out``.

    Called before the measurement, so that a run of many minutes never ends unable to write."""
    if out is not None:
        return Path(out)
    target = resource(name)
    if isinstance(target, Path) and os.access(target.parent, os.W_OK) and \
            (not target.exists() or os.access(target, os.W_OK)):
        return target
    raise UsageError(f"{command}: the packaged {name} ({target}) is not writable here; "
                     f"pass --out FILE to write the result elsewhere")
