"""The version matrix: the cpu and sim tiers under neighbouring torch and Lightning releases,
against the same committed baselines, then one table of which numbers moved under which library.

    nox                           # every combination below (each in its own virtualenv), then the report
    nox -- -k fabric              # extra pytest arguments for every combination
    nox -s matrix_report          # the table again, from the JSON each combination left

torchvision must match torch's build as well as its version: a local ``torch==2.13.0+cpu`` wheel
satisfies ``torch==2.13.0``, but the torchvision published for 2.13.0 is the CUDA build and does
not load beside it. The environment preflight then stops that combination with one line, and the
report says so, instead of thousands of tracebacks.
"""

from __future__ import annotations

import json
from pathlib import Path

import nox

nox.options.sessions = ["tiers", "matrix_report"]
nox.options.reuse_existing_virtualenvs = True

OUT = Path("memclaims-results") / "matrix"
# (torch, torchvision, lightning): the pinned stack and its neighbours.
COMBINATIONS = [
    ("2.14.1", "0.29.1", "2.6.6"),
    ("2.14.1", "0.29.1", "2.5.6"),
    ("2.13.0", "0.28.0", "2.6.6"),
]


@nox.session
@nox.parametrize(("torch", "torchvision", "lightning"), COMBINATIONS)
def tiers(session: nox.Session, torch: str, torchvision: str, lightning: str) -> None:
    session.install("-e", ".[test]", f"torch=={torch}", f"torchvision=={torchvision}", f"lightning=={lightning}")
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"torch{torch}-lightning{lightning}"
    summary = OUT / f"{name}.json"
    summary.unlink(missing_ok=True)
    output = session.run("pytest", "-m", "(cpu or sim) and not slow", "-p", "no:cacheprovider", "-q",
                         f"--memclaims-summary-json={summary}", "--memclaims-summary=all",
                         *session.posargs, success_codes=[0, 1, 2, 4, 5], silent=True) or ""
    print(output)
    if not summary.exists():  # pytest stopped before any case (the preflight's line says why)
        reason = next((line for line in output.splitlines() if line.startswith("ERROR")), "pytest ran no case")
        summary.write_text(json.dumps({"rows": [], "error": reason}))


@nox.session(python=False)
def matrix_report(session: nox.Session) -> None:
    session.run("python", "-m", "memclaims.matrix", str(OUT), external=True)
