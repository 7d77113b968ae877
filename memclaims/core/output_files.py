"""Files memclaims writes for a person to read (the summary JSON, the HTML report): their folder is
created, and a folder that cannot be written is one line naming the path and the fix, never a
traceback (the baseline store has its own atomic, locked writer: memclaims.baselines.store)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from memclaims.core.errors import MemclaimsError


class OutputError(MemclaimsError):
    """A file memclaims was asked to write cannot be written; the message names it and the fix."""


def unwritable(path: Path, error: OSError, option: str) -> OutputError:
    reason = error.strerror or str(error)
    return OutputError(f"{option} {path}: cannot write there ({reason}: {error.filename or path}); "
                       f"make the folder writable or give {option} a path in a writable folder")


def prepare(path: Path, option: str) -> None:
    """Create ``path``'s folder and prove a file can be created in it, before anything is measured
    (a night's run must not end unable to write its report). ``os.access`` is no proof: it says yes
    to root on a read-only mount's files and knows nothing of a full disk's quota."""
    probe = path.parent / f".{path.name}.{secrets.token_hex(4)}.probe"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.unlink(probe)
    except OSError as error:
        raise unwritable(path, error, option) from None


def write_text(path: Path, text: str, option: str) -> Path:
    """Write ``text`` to ``path``, creating its folder; OutputError (one line) when it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise unwritable(path, error, option) from None
    return path
