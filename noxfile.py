"""The version matrix: neighbouring releases of the stack, each judged against the committed baselines.

    nox                         # every combination below, one `memclaims upgrade` each
    nox -s matrix -- --tiers cpu,sim   # extra arguments for memclaims upgrade
    nox -s newest               # the newest release of each tested package against the lock, recorded as tested

Each combination is a `memclaims upgrade SPEC...` (memclaims.report.upgrade): it builds the
candidate's environment with uv (a torchvision is matched to its torch there), measures the cpu,
converged, dist and sim tiers in it, and writes memclaims-results/matrix/<name>/upgrade.md with what
moved, attributed to the package that changed. This session needs no virtualenv of its own.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["matrix"]

# The candidates: each is what one upgrade would change against this checkout's own stack.
COMBINATIONS = {
    "torch2.15.0": ("torch==2.15.0",),
    "torch2.13.0": ("torch==2.13.0",),
    "lightning2.5.6": ("lightning==2.5.6",),
}


@nox.session(python=False)
@nox.parametrize("name", list(COMBINATIONS))
def matrix(session: nox.Session, name: str) -> None:
    session.run("memclaims", "upgrade", *COMBINATIONS[name], "--lock", "locks/ci.txt", "--out",
                f"memclaims-results/matrix/{name}", *session.posargs, success_codes=[0, 1], external=True)


@nox.session(python=False)
def newest(session: nox.Session) -> None:
    """The newest release of each tested package, beside the lock; recorded as tested when nothing regressed."""
    session.run("memclaims", "upgrade", "--newest", "--lock", "locks/ci.txt", "--record", "--out",
                "memclaims-results/newest", *session.posargs, external=True)
