"""The verdicts of the last pytest run that checked each claim, and how the coverage table shows them
(the table itself joins them with the catalogue: memclaims.claims.catalogue.table).

pytest writes ``memclaims-results/claims-last-run.json`` (memclaims.pytest.claims): for every
(claim, tier) whose check ran, its verdict, detail and test node. Runs add to the file (a cpu run
and a later sim run both show), each entry stamped with its time. ``memclaims claims`` reads it
beside the catalogue (memclaims/resources/sources/).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from memclaims.core import published

LAST_RUN_NAME = "claims-last-run.json"
# A (claim, tier)'s verdict, as the last-run file stores it and ``memclaims claims`` shows it.
Verdict = Literal["holds", "does not hold", "does not hold (expected)", "skipped", "error", "not run",
                  "holds, but the catalogue says it does not: correct its source's file (memclaims/resources/sources/)"]
NOT_RUN: Verdict = "not run"
_CLAIM_NODE = re.compile(r"suite/cases/test_claims\.py::test_claim\[(?P<tier>\w+):(?P<claim>[^\]]+)\]$")


def external_checks() -> dict[str, list[tuple[str, str]]]:
    """Test node (without parameters) -> the (claim, tier) pairs the catalogue says it checks."""
    nodes: dict[str, list[tuple[str, str]]] = {}
    for entry in published.claims():
        for tier, where in entry["checks"].items():
            if where != "claims":
                nodes.setdefault(where, []).append((entry["id"], tier))
    return nodes


def claims_of(nodeid: str) -> list[tuple[str, str]]:
    """The (claim, tier) pairs a test node checks; empty for every other test."""
    match = _CLAIM_NODE.search(nodeid)
    if match:
        return [(match["claim"], match["tier"])]
    base, _, params = nodeid.partition("[")
    pairs = external_checks().get(base, [])
    # A case parametrized by tier (``test_case[cpu:vit-smoke/...]``) checks the claim on that tier only.
    tier = params.split(":", 1)[0] if ":" in params else ""
    return [pair for pair in pairs if pair[1] == tier] if tier in published.TIERS else pairs


UNEXPECTED_HOLD: Verdict = "holds, but the catalogue says it does not: correct its source's file (memclaims/resources/sources/)"
_RANK: dict[Verdict, int] = {"does not hold": 3, "error": 3, UNEXPECTED_HOLD: 3, "holds": 2, "does not hold (expected)": 1, "skipped": 0}


def verdict_of(outcome: str, when: str, wasxfail: bool, longrepr: str = "") -> Verdict:
    if outcome == "failed" and longrepr.startswith("[XPASS(strict)]"):
        return UNEXPECTED_HOLD
    if wasxfail:
        return "does not hold (expected)" if outcome == "skipped" else "holds"
    if outcome == "passed":
        return "holds"
    if outcome == "skipped":
        return "skipped"
    return "does not hold" if when == "call" else "error"


def merge(entries: dict[str, dict[str, Any]], key: str, new: dict[str, Any]) -> None:
    """A parametrized external check: a failure anywhere wins, then a pass, then a skip."""
    old = entries.get(key)
    if old is None or old.get("session") != new["session"] or _RANK[new["verdict"]] > _RANK[old["verdict"]]:
        entries[key] = new


def write(path: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Add this session's verdicts to the file, keeping those of claims this session did not run."""
    existing = read(path)
    existing.update(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "verdicts": existing}, indent=2, sort_keys=True) + "\n")


def read(path: Path) -> dict[str, dict[str, object]]:
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("verdicts", {}))


def key(claim: str, tier: str) -> str:
    return f"{claim}@{tier}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- the table -----------------------------------------------------------------------------------


def coverage(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Asserted on a tier without a GPU (cpu, sim, dist), only on the GPU tier, or nowhere."""
    counts = {"asserted_without_gpu": 0, "gpu_only": 0, "nowhere": 0, "total": 0}
    for row in rows:
        checked = {t for t, v in row["tiers"].items() if "checked_by" in v}
        counts["total"] += 1
        if checked - {"gpu"}:
            counts["asserted_without_gpu"] += 1
        elif checked:
            counts["gpu_only"] += 1
        else:
            counts["nowhere"] += 1
    return counts


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The table for a terminal: one line per claim, a verdict per tier, then reasons and audits."""
    short: dict[Verdict, str] = {UNEXPECTED_HOLD: "XPASS", "holds": "ok", "does not hold": "FAIL", "does not hold (expected)": "xfail", "skipped": "skip",
             "error": "ERR", NOT_RUN: "-"}
    lines = [f"{'claim':<32} {'kind':<9} {'printed':<12} " + " ".join(f"{t:<6}" for t in published.TIERS) + "  where",
             f"{'':<32} {'':<9} {'':<12} " + " ".join(f"{'':<6}" for _ in published.TIERS) +
             "  (printed: in the seed's text, the article's logs.md, a figure, or derived; ok/FAIL/xfail/skip: last run; "
             "-: checked there, not run yet; .: not checked, see reasons)"]
    sources = published.documents()
    document = None
    for row in rows:
        if row["document"] != document:
            document = row["document"]
            lines.append(f"-- {document}: {sources[document]['title']} ({sources[document]['where']})")
        cells = []
        for tier in published.TIERS:
            cell = row["tiers"][tier]
            cells.append(f"{short.get(cell['verdict'], cell['verdict']) if 'checked_by' in cell else '.':<6}")
        lines.append(f"{row['claim']:<32} {row['kind']:<9} {row['source_kind']:<12} {' '.join(cells)}  {row['where']}")
        if row["text_vs_logs"]:
            lines.append(f"{'':<34}text {row['text_vs_logs']['text']}; logs {row['text_vs_logs']['logs']}")
    counts = coverage(rows)
    lines.append("")
    lines.append(f"{counts['total']} claims: {counts['asserted_without_gpu']} asserted on a tier without a GPU, "
                 f"{counts['gpu_only']} only on the GPU tier, {counts['nowhere']} checked nowhere (each with its "
                 f"reason: memclaims claims --json)")
    return lines
