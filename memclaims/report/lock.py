"""The locked stack: the exact releases CI and the README's test set-up install, and its candidates.

A lock is a requirements file compiled by uv (``uv pip compile``) from the project's
``pyproject.toml``: every package and the extras CI installs, pinned, for every platform at once
(``--universal``: the CUDA libraries a torch wheel needs on Linux carry their markers). uv and not a
hand-written freeze: it keeps the pins of the existing file as preferences and moves only what an
upgrade names (``--upgrade-package``) and what that release needs, so a bump's diff is the bump. pip
reads the file as constraints (``pip install -e ".[test,docs]" -c locks/ci.txt``), uv as requirements.

memclaims upgrade ``--lock FILE`` compiles the candidate's lock this way beside the committed one
(:func:`compile_candidate`), builds its environment from it, and with ``--accept`` writes it over
the committed lock once the candidate has been judged against the baselines (``memclaims.report.upgrade``).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from memclaims.core.errors import MemclaimsError, UsageError

# How every lock of this project is compiled: the extras CI installs, every platform, the lowest Python
# the locked releases support (transformers 5 needs 3.11). One place: the bump and its tests read it.
COMPILE_OPTIONS = ("--extra", "test", "--extra", "docs", "--universal", "--python-version", "3.11")
# What the lock's header says regenerates it (uv writes it there: --custom-compile-command).
BUMP_COMMAND = "memclaims upgrade SPEC... --lock locks/ci.txt --accept"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


class LockError(MemclaimsError):
    """The candidate's lock could not be compiled: one line saying why."""


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"--lock {path}: cannot read it ({error.strerror}); give the compiled lock, e.g. "
                         "locks/ci.txt") from None


def pins(path: Path) -> dict[str, str]:
    """Package (canonical name) -> pinned version, from a compiled lock; a package pinned once per
    platform (a marker each) keeps its first line's version."""
    found: dict[str, str] = {}
    for line in _lines(path):
        match = _PIN.match(line.strip())
        if match:
            found.setdefault(canonicalize_name(match.group(1)), match.group(2))
    if not found:
        raise UsageError(f"--lock {path}: no 'package==version' line; give a lock compiled by uv pip compile")
    return found


def digest(path: Path) -> str:
    """The lock's identity in CI's header: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def project_of(lock: Path) -> Path:
    """The pyproject.toml a lock is compiled from: the project's root holds it, the lock lies in a
    folder of that root (locks/ci.txt)."""
    for folder in (lock.resolve().parent, *lock.resolve().parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    raise UsageError(f"--lock {lock}: no pyproject.toml above it to compile a candidate from; --lock is for a "
                     "checkout of the project whose lock it is")


def upgrade_arguments(upgrades: Sequence[str]) -> list[str]:
    """uv's ``--upgrade-package`` for each requirement (``torch==2.15.0``, or a bare ``torch``: its newest
    release); a torch upgrade also frees torchvision, which must be the build for its torch."""
    names = {canonicalize_name(Requirement(text).name) for text in upgrades}
    extra = ["torchvision"] if "torch" in names and "torchvision" not in names else []
    return [arg for text in (*upgrades, *extra) for arg in ("--upgrade-package", text)]


def compile_candidate(lock: Path, upgrades: Sequence[str], out: Path, uv: str) -> Path:
    """``out``: the committed ``lock`` with ``upgrades`` applied (and only what they need moved)."""
    project = project_of(lock)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock, out)  # the existing pins are uv's preferences
    command = [uv, "pip", "compile", str(project), *COMPILE_OPTIONS, "--quiet", "--output-file", str(out),
               "--custom-compile-command", BUMP_COMMAND, *upgrade_arguments(upgrades)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=project.parent)
    if done.returncode:
        lines = [line.strip(" ×│╰─▶") for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise LockError(f"the candidate's lock could not be compiled for {' '.join(upgrades)}: "
                        f"{next((line for line in lines if 'no version' in line or 'unsatisfiable' in line), lines[-1] if lines else 'uv failed without output')}")
    return out


def changed(before: dict[str, str], after: dict[str, str], packages: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``packages`` whose pinned release differs between two locks: name -> (before, after)."""
    return {p: (before.get(p, "-"), after.get(p, "-")) for p in packages if before.get(p) != after.get(p)}


def mismatches(path: Path) -> list[str]:
    """Each pin of the lock that applies here (its marker holds) and is not what is installed."""
    from importlib import metadata

    out = []
    for line in _lines(path):
        if not _PIN.match(line.strip()):
            continue
        try:
            requirement = Requirement(line.strip())
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            out.append(f"{requirement.name} {installed or 'not installed'} (locked {requirement.specifier})")
    return out


def header(path: Path, packages: Sequence[str], wrong: list[str] | None = None) -> str:
    """One line: which lock, its digest, the tested packages it pins, and whether this environment is it
    (``wrong``: its :func:`mismatches`, where the caller has them)."""
    pinned = pins(path)
    stack = ", ".join(f"{p} {pinned[p]}" for p in packages if p in pinned)
    wrong = mismatches(path) if wrong is None else wrong
    state = "installed as locked" if not wrong else f"NOT as locked: {'; '.join(wrong[:5])}" + \
        (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
    return f"memclaims: lock {path} (sha256 {digest(path)}, {len(pinned)} pins: {stack}): {state}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memclaims.report.lock FILE``: the header line; exit 1 when this environment is not the lock."""
    import argparse

    from memclaims.core.tested_versions import PACKAGES

    parser = argparse.ArgumentParser(prog="python -m memclaims.report.lock", description=main.__doc__)
    parser.add_argument("lock", type=Path)
    args = parser.parse_args(argv)
    try:
        wrong = mismatches(args.lock)
        print(header(args.lock, (*PACKAGES, "peft"), wrong))
        return 1 if wrong else 0
    except MemclaimsError as error:
        print(f"memclaims: {error}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
