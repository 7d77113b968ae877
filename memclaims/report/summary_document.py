"""The summary document of one pytest run (``--memclaims-summary-json``): what the HTML report, the CI
step summary and ``memclaims history`` read.

Schema 2 keeps schema 1's ``rows`` (every baseline comparison) and ``out_of_memory``, and adds what a
reader needs without the terminal: the run's failures with their messages, the test outcomes, the
claim table with a verdict per tier, the installed library versions, the selection, and the
diagnosis files the run saved. The pytest plugin fills it (``memclaims.pytest.summary_files``); this
module only reads and counts it, so that every reader agrees on its meaning.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from memclaims.core.errors import UsageError

SCHEMA = 2
# Phase peaks shown as bars: the absolute peak of each phase (memclaims.baselines.compare's
# ``phases.<phase>.<key>`` metrics), reserved where the allocator has one (CUDA, sim).
PHASE_BAR_KEYS = ("reserved_bytes", "allocated_bytes")


def load(path: Path) -> dict[str, Any]:
    """A summary file, checked enough that every reader can trust its keys (else one-line UsageError)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; write one with pytest --memclaims-summary-json {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path}: not a memclaims summary JSON ({error}); write one with pytest "
                         f"--memclaims-summary-json PATH") from None
    return load_dict(data, str(path))


def load_dict(data: object, where: str = "summary") -> dict[str, object]:
    """A parsed summary with every key a reader uses (an older schema's missing ones empty)."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise UsageError(f"{where}: not a memclaims summary JSON (no 'rows' list); write one with pytest "
                         f"--memclaims-summary-json PATH")
    data.setdefault("schema", 1)
    for name, empty in (("out_of_memory", []), ("failures", []), ("claims", []), ("outcomes", {}),
                        ("session", {}), ("diagnosis", [])):
        data.setdefault(name, empty)
    return data


def dump(data: dict[str, object]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def claim_verdicts(data: dict[str, Any]) -> dict[str, Counter[str]]:
    """Per tier, how many claims ran to each verdict (the table holds this session's verdicts only;
    claims it did not run are left out)."""
    counts: dict[str, Counter[str]] = {}
    for row in data["claims"]:
        for tier, cell in row["tiers"].items():
            if cell.get("at"):  # memclaims.claims.runs.table: when it ran; empty for a claim not run
                counts.setdefault(tier, Counter())[cell["verdict"]] += 1
    return counts


def phase_bars(data: dict[str, Any]) -> dict[str, dict[str, tuple[float | None, float | None]]]:
    """Per case, per phase: (baseline, now) of its absolute peak, from the comparison rows."""
    bars: dict[str, dict[str, tuple[float | None, float | None]]] = {}
    for key in PHASE_BAR_KEYS:
        for row in data["rows"]:
            parts = str(row["metric"]).split(".")
            if len(parts) != 3 or parts[0] != "phases" or parts[2] != key:
                continue
            phases = bars.setdefault(row["case"], {})
            if parts[1] not in phases or key == PHASE_BAR_KEYS[0]:
                phases[parts[1]] = (row["baseline"], row["now"])
    return bars


def environment_changes(data: dict[str, Any]) -> dict[str, list[str]]:
    """Each distinct 'environment since the baseline' text, with the cases it applies to."""
    changes: dict[str, list[str]] = {}
    for row in data["rows"]:
        text = row.get("environment_change")
        if text and row["case"] not in changes.setdefault(text, []):
            changes[text].append(row["case"])
    return changes
