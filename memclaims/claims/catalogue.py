"""The claims of every source (the seed documents and the techniques' own documentation), joined to their checks.

The catalogue (every claim, its source phrase, kind, published numbers, the tiers that check it and
why the others do not) is ``memclaims/resources/sources/``, one file per source; each source's checks are
its module of ``memclaims.claims.sources`` (``article.py`` for ``article.json``, ``pytorch_docs.py`` for
``pytorch-docs.json``, ...), built from the shared machinery: ``check`` (Check, Verdict), ``ratio`` (a size claim as
a ratio of peaks, derived at smoke scale on the cpu tier), ``figures`` (the peak claims compare, the detail's
units). A check takes the tier and a lookup (``memclaims.claims.lookup``: techniques, or a variant of a recipe ->
Record of this session on that tier; the facts beside) and returns a Verdict whose detail always carries the
numbers: "published X, this run Y", and where the article's text and its logs disagree, "text X, logs Y, this run
Z". A check runs nothing: its caller measured the Records it declares (``Check.recipes``) through
``memclaims.run.run_recipe``. This module joins each claim to its check (``CLAIMS``, in the sources' files' order)
and holds the coverage rule: every claim, per tier, a check or a reason; every check in its own source's module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from memclaims.claims import runs
from memclaims.claims.check import Check, audit_text
from memclaims.claims.sources import (
    article,
    bitsandbytes_docs,
    course,
    lightning_docs,
    peft_docs,
    pytorch_docs,
    pytorch_tutorial,
    qlora_paper,
    stacks_docs,
    torchao_docs,
)
from memclaims.core import published

# One module per source file of memclaims/resources/sources/ (its DOCUMENT), each with the CHECKS of its claims; in
# the files' order.
SOURCES: tuple[ModuleType, ...] = (article, bitsandbytes_docs, course, lightning_docs, peft_docs, pytorch_docs,
                                   pytorch_tutorial, qlora_paper, stacks_docs, torchao_docs)
CHECKS: dict[str, Check] = {name: check for source in SOURCES for name, check in source.CHECKS.items()}
# Claim -> the document whose module checks it (coverage_problems: a check lives with its source).
CHECKED_IN: dict[str, str] = {name: source.DOCUMENT for source in SOURCES for name in source.CHECKS}


@dataclass(frozen=True)
class Claim:
    """One catalogued claim: its entry in its source's file (resources/sources/), and its check where memclaims has one."""

    name: str
    statement: str
    source: str
    kind: str
    document: str
    published: dict[str, object]
    checks: dict[str, str]  # tier -> "claims" (its source's module) or the pytest node that checks it
    not_on: dict[str, str]  # tier -> why that tier does not check the claim
    audit: dict[str, str] = field(default_factory=dict)  # {"text": ..., "logs": ...}
    note: str = ""
    check: Check | None = None
    printed: dict[str, str] = field(default_factory=dict)  # number key -> where it is printed (text/logs/...)

    @property
    def source_kind(self) -> str:
        """Where its numbers are printed, in published.SOURCE_KINDS order: 'text', 'logs', 'text+logs'..."""
        kinds = set(self.printed.values())
        return "+".join(k for k in published.SOURCE_KINDS if k in kinds)

    @property
    def tiers(self) -> frozenset[str]:
        """The tiers where this module checks the claim (suite/cases/test_claims.py)."""
        return frozenset(t for t, where in self.checks.items() if where == "claims")

    @property
    def workload(self) -> str:
        return self.check.workload if self.check else "vit"

    @property
    def needs_accuracy(self) -> bool:
        return bool(self.check and self.check.needs_accuracy)

    def audited(self, this_run: str) -> str:
        """'text X, logs Y, this run Z' where the documents disagree with themselves, else ''."""
        return audit_text(self.audit, this_run)


def _build() -> tuple[Claim, ...]:
    result = []
    for entry in published.claims():
        result.append(Claim(
            name=entry["id"], statement=entry["phrase"], source=entry["where"], kind=entry["kind"],
            document=entry["document"], published=published.numbers(entry["id"]), checks=dict(entry["checks"]),
            not_on=dict(entry["not_on"]), audit=dict(entry.get("text_vs_logs", {})), note=entry.get("note", ""),
            check=CHECKS.get(entry["id"]), printed=published.printed(entry["id"])))
    return tuple(result)


CLAIMS: tuple[Claim, ...] = _build()
CLAIMS_BY_NAME: dict[str, Claim] = {c.name: c for c in CLAIMS}
BY_NAME = CLAIMS_BY_NAME


def skip_reason(claim: Claim, tier: str) -> str | None:
    """Why ``tier`` does not run this claim's check here (None: it does)."""
    if claim.checks.get(tier) == "claims":
        return None
    if tier in claim.checks:
        return f"checked by {claim.checks[tier]}"
    return claim.not_on.get(tier, f"claim {claim.name!r} is not checked on the {tier} tier")


def coverage_problems() -> list[str]:
    """Every catalogued claim needs, per tier, a check or a reason; every 'claims' check must exist."""
    problems = []
    for claim in CLAIMS:
        for tier in published.TIERS:
            if (tier in claim.checks) == (tier in claim.not_on):
                problems.append(f"{claim.name}: tier {tier} needs exactly one of a check and a reason")
        if claim.kind not in published.KINDS:
            problems.append(f"{claim.name}: kind {claim.kind!r} is not one of {', '.join(published.KINDS)}")
        if claim.tiers and claim.check is None:
            problems.append(f"{claim.name}: the catalogue says {source_module(claim.document)} checks it, but it has no "
                            "check")
        if claim.check is not None and claim.tiers != claim.check.tiers:
            problems.append(f"{claim.name}: catalogue tiers {sorted(claim.tiers)} != check tiers {sorted(claim.check.tiers)}")
        for tier in published.claim(claim.name).get("does_not_hold", {}):
            if tier not in claim.tiers:
                problems.append(f"{claim.name}: recorded as not holding on {tier}, which does not check it")
        unsourced = sorted(set(claim.published) - set(claim.printed)) or ([] if claim.printed else ["phrase"])
        if unsourced:
            problems.append(f"{claim.name}: no source kind (printed) for {', '.join(unsourced)}")
        odd = sorted(k for k in claim.printed.values() if k not in published.SOURCE_KINDS)
        if odd:
            problems.append(f"{claim.name}: source kind {', '.join(odd)} is not one of {', '.join(published.SOURCE_KINDS)}")
        for tier, reason in claim.not_on.items():
            if not reason.strip():
                problems.append(f"{claim.name}: empty reason for tier {tier}")
    for name, document in CHECKED_IN.items():
        if name not in CLAIMS_BY_NAME:
            problems.append(f"check {name!r} has no catalogue entry in memclaims/resources/sources/")
        elif CLAIMS_BY_NAME[name].document != document:
            problems.append(f"check {name!r} is in {source_module(document)}, but its claim is in "
                            f"{CLAIMS_BY_NAME[name].document}.json: move it to {source_module(CLAIMS_BY_NAME[name].document)}")
    for document in sorted(set(published.documents()) ^ {source.DOCUMENT for source in SOURCES}):
        where = "has no module in SOURCES" if document in published.documents() else "has no file in resources/sources/"
        problems.append(f"source {document!r} {where}: one module of memclaims/claims/sources/ per source file")
    return problems


def source_module(document: str) -> str:
    """The module that holds a source's checks, by the source file's name (``pytorch-docs`` -> ``pytorch_docs.py``)."""
    return f"memclaims/claims/sources/{document.replace('-', '_')}.py"


def table(last_run: dict[str, dict[str, object]]) -> list[dict[str, Any]]:
    """Every claim of the catalogue with its last verdict per tier (memclaims.claims.runs' store), or why a tier
    does not check it: what ``memclaims claims`` and the summary JSON show."""
    rows = []
    for claim in CLAIMS:
        tiers = {}
        for tier in published.TIERS:
            if tier in claim.checks:
                entry = last_run.get(runs.key(claim.name, tier))
                tiers[tier] = {"checked_by": claim.checks[tier], "verdict": entry["verdict"] if entry else runs.NOT_RUN,
                               "detail": entry.get("detail", "") if entry else "",
                               "at": entry.get("at", "") if entry else ""}
            else:
                tiers[tier] = {"not_checked": claim.not_on[tier]}
        rows.append({"claim": claim.name, "kind": claim.kind, "document": claim.document,
                     "source_kind": claim.source_kind, "printed": claim.printed,
                     "phrase": claim.statement, "where": claim.source, "published": claim.published,
                     "text_vs_logs": claim.audit, "tiers": tiers})
    return rows
