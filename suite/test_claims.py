"""The article's claims as relations over Records of this session, on each tier that can hold them."""

from __future__ import annotations

from typing import Any

import pytest

from fixtures.records import RecordCache
from memclaims.claims import CLAIMS, Claim, skip_reason


def _params() -> list[Any]:
    params = []
    for tier in ("cpu", "sim", "gpu"):
        for claim in CLAIMS:
            marks = [getattr(pytest.mark, tier)]
            reason = skip_reason(claim, tier)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            params.append(pytest.param(tier, claim, id=f"{tier}:{claim.name}", marks=marks))
    return params


@pytest.mark.parametrize(("tier", "claim"), _params())
def test_claim(tier: str, claim: Claim, record_cache: RecordCache, record_property: Any) -> None:
    def lookup(techniques: tuple[str, ...]):
        return record_cache.get(tier, record_cache.recipe(tier, claim.workload, techniques))

    verdict = claim.check(lookup)
    record_property("claim", claim.name)
    record_property("detail", verdict.detail)
    assert verdict.passed, f"{claim.statement} ({claim.source}) does not hold: {verdict.detail}"
