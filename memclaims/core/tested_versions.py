"""The range of the training stack this memclaims was tested with, and where a run lies in it.

The packaged ``tested_versions.json`` (one table: each package's lowest and highest tested release,
and what "tested" means) is read here only. pyproject.toml bounds these packages from below only,
so that a newer release installs and runs: the pytest header and every Record
(``Record.versions_tested``) say which releases ran and whether each lies inside that range.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from memclaims.core import packaged
from memclaims.core.record import installed_versions, library_versions

INSIDE, NEWER, OLDER, UNKNOWN = "inside", "newer", "older", "unknown"
# The libraries the suite exists to test (pyproject.toml bounds them from below only).
PACKAGES = ("torch", "torchvision", "lightning", "torchmetrics", "transformers", "bitsandbytes")


@cache
def table() -> dict[str, tuple[str, str]]:
    """Package -> (lowest, highest) tested release, from the packaged file."""
    data = json.loads(packaged.resource(packaged.TESTED_VERSIONS).read_text(encoding="utf-8"))
    return {name: (entry["lowest"], entry["highest"]) for name, entry in data["packages"].items()}


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers of a version: ``2.15.0+cu128`` and ``2.15.0rc1`` are 2.15.0 (a local
    build or a candidate of a tested release is that release), ``2.16.0.dev20250101`` is 2.16.0."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    if not found:
        return None
    numbers = tuple(int(part) for part in found.group().split("."))
    return numbers + (0,) * (3 - len(numbers))


def position(package: str, version: str | None) -> str:
    """Where ``version`` of ``package`` lies: inside, newer, older, or unknown (not installed, not
    a version number, or a package without a tested range)."""
    bounds = table().get(package)
    numbers = release(version) if version else None
    if bounds is None or numbers is None:
        return UNKNOWN
    lowest, highest = (release(bound) for bound in bounds)
    if highest is not None and numbers > highest:
        return NEWER
    if lowest is not None and numbers < lowest:
        return OLDER
    return INSIDE


def classify(versions: Mapping[str, str | None]) -> dict[str, str]:
    """``Record.versions_tested``: each tested package of ``versions`` (a Record's) -> its position."""
    return {package: position(package, versions.get(package)) for package in PACKAGES}


def installed() -> dict[str, str | None]:
    """The installed versions of the tested packages, from their metadata (nothing is imported)."""
    return installed_versions(PACKAGES)


def header_lines(versions: Mapping[str, str | None]) -> list[str]:
    """The pytest header: which releases run and whether each is inside the tested range; one more
    line for the releases newer (or older) than any tested."""
    where = classify(versions)
    shown = ", ".join(f"{p} {versions.get(p) or 'not installed'}" for p in PACKAGES)
    outside = {p: w for p, w in where.items() if w in (NEWER, OLDER)}
    summary = "each inside the tested range" if not outside and UNKNOWN not in where.values() else \
        "; ".join(f"{p} {w}" for p, w in where.items() if w != INSIDE)
    lines = [f"memclaims: stack {shown} ({summary}; tested range: memclaims/resources/tested_versions.json)"]
    for kind, edge, word in ((NEWER, 1, "newest"), (OLDER, 0, "oldest")):
        named = [f"{p} {versions[p]} ({word} tested {table()[p][edge]})" for p, w in outside.items() if w == kind]
        if named:
            lines.append(f"memclaims: {', '.join(named)}: {kind} than tested; it runs, and a number it moves "
                         "fails its case naming the release")
    return lines


def version_fields() -> dict[str, Any]:
    """A new Record's ``versions`` and ``versions_tested``."""
    versions = library_versions()
    return {"versions": versions, "versions_tested": classify(versions)}
