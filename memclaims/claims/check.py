"""What a claim's check is: a relation over Records (``Check``: the tiers it runs on, the Records it asks its lookup
for) that returns a ``Verdict`` whose detail always carries the numbers. The checks themselves live with their
source (``memclaims.claims.sources``); the catalogue (``memclaims.claims.catalogue``) joins them to the claims."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memclaims.core import published

if TYPE_CHECKING:  # annotations only: a check's module imports the lookup itself (the import chain stays short)
    from memclaims.claims.lookup import Key, Lookup


@dataclass(frozen=True)
class Verdict:
    passed: bool
    detail: str  # the numbers, always: a passing claim is reported as fully as a failing one


@dataclass(frozen=True)
class Check:
    run: Callable[[str, Lookup], Verdict]
    tiers: frozenset[str]
    # Keys per tier ("*" for every tier): what the lookup will be asked for, in order.
    recipes: dict[str, tuple[Key, ...]] = field(default_factory=dict)
    workload: str = "vit"
    needs_accuracy: bool = False
    # The scale the lookup resolves the recipes at, per tier, where not the tier's own (the cpu
    # tier's accuracy claims compare the converged scale: memclaims.claims.accuracy).
    scales: dict[str, str] = field(default_factory=dict)

    def recipes_on(self, tier: str) -> tuple[Key, ...]:
        return self.recipes.get(tier, self.recipes.get("*", ()))

    def scale_on(self, tier: str) -> str | None:
        return self.scales.get(tier)


def audit_text(audit: dict[str, str], this_run: str) -> str:
    """'text X, logs Y, this run Z' where the documents disagree with themselves (``audit``), else ''."""
    if not audit:
        return ""
    return f"text {audit['text']}, logs {audit['logs']}, this run {this_run}"


def audited(claim: str, this_run: str) -> str:
    """``audit_text`` of the claim's entry in its source's file (its ``text_vs_logs``)."""
    return audit_text(dict(published.claim(claim).get("text_vs_logs", {})), this_run)
