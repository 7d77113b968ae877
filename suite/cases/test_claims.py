"""The claims of every source (memclaims/resources/sources/) on each tier that can hold them.

One case per (tier, claim) that memclaims/claims/catalogue.py checks; a tier that does not check a claim
skips it at collection with the catalogue's reason, or names the test that checks it instead. A
claim the catalogue records as not holding on a tier is a strict xfail: the day it holds, the
case fails and the catalogue must be corrected.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from fixtures.paths import ROOT
from memclaims.claims.catalogue import CLAIMS, Claim, coverage_problems, skip_reason
from memclaims.claims.lookup import Lookup
from memclaims.core import published
from memclaims.core.names import CONVERGED
from memclaims.pytest.records import CPU_CONVERGED_GROUP, RecordCache, claim_needs

# Issue #43 item 3's claims run on the worker of their technique's case file (its xdist_group): the same Records.
ISSUE_43_GROUPS = {"selective-checkpointing-": "selective-checkpointing", "torchao-low-bit-": "torchao-adamw"}


def _params() -> list[Any]:
    params = []
    for tier in ("cpu", "sim", "gpu"):
        for claim in CLAIMS:
            if claim.check is None or claim.checks.get(tier, "claims") != "claims":
                continue  # checked by another test, or nowhere by this module: memclaims claims says which
            # The catalogue's "not on this tier" and the machine's lacks: one skip, at collection.
            marks = [getattr(pytest.mark, tier), pytest.mark.requires(claim_needs(claim, tier))]
            expected_failure = published.claim(claim.name).get("does_not_hold", {}).get(tier)
            if expected_failure and skip_reason(claim, tier) is None:  # a skipped case never reaches it
                marks.append(pytest.mark.xfail(reason=expected_failure, strict=True))
            if tier == "cpu" and claim.kind == "accuracy":  # the converged Records of test_accuracy.py
                marks.append(pytest.mark.xdist_group(CPU_CONVERGED_GROUP))
            group = next((g for prefix, g in ISSUE_43_GROUPS.items() if claim.name.startswith(prefix)), None)
            if group:  # the Records of its technique's own case file, measured once on one worker
                marks.append(pytest.mark.xdist_group(group))
            params.append(pytest.param(tier, claim, id=f"{tier}:{claim.name}", marks=marks))
    return params


@pytest.mark.parametrize(("tier", "claim"), _params())
def test_claim(tier: str, claim: Claim, record_cache: RecordCache, record_property: Any) -> None:
    assert claim.check is not None
    record_property("claim", claim.name)
    record_property("tier", tier)
    # The Records the check reads, measured once this session through memclaims.run.run_recipe.
    verdict = claim.check.run(tier, record_cache.lookup(tier, claim))
    record_property("detail", verdict.detail)
    assert verdict.passed, f"{claim.statement} ({claim.source}) does not hold: {verdict.detail}"


# --- the catalogue ---------------------------------------------------------------------------------


def test_every_claim_has_a_check_or_a_reason_on_every_tier() -> None:
    assert coverage_problems() == []
    assert len(CLAIMS) >= 76  # both documents, the logs' numbers included: 76 today (#26 added 7 of the seeds)


def test_a_claim_without_check_or_reason_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import memclaims.claims.catalogue as claims

    broken = claims.CLAIMS[0]
    without = type(broken)(**{**broken.__dict__, "not_on": {}, "checks": {}})
    monkeypatch.setattr(claims, "CLAIMS", (without, *claims.CLAIMS[1:]))
    problems = claims.coverage_problems()
    assert f"{broken.name}: tier dist needs exactly one of a check and a reason" in problems


def test_checks_named_in_other_modules_exist() -> None:
    for claim in CLAIMS:
        for tier, where in claim.checks.items():
            if where == "claims":
                continue
            path, _, name = where.partition("::")
            assert _defines(ROOT / path, name), f"{claim.name} on {tier}: {where} does not exist"


def _defines(path: Path, name: str) -> bool:
    """Whether the test module defines ``name`` or imports it from a module that does (a test module
    may take its test function from the plugin, as suite/cases/test_technique_matrix.py does)."""
    tree = ast.parse(path.read_text())
    if any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body):
        return True
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            spec = importlib.util.find_spec(node.module)
            return spec is not None and spec.origin is not None and _defines(Path(spec.origin), name)
    return False


def test_published_numbers_resolve_and_kinds_are_known() -> None:
    for claim in CLAIMS:
        assert claim.kind in published.KINDS
        for key, value in claim.published.items():
            assert not (isinstance(value, str) and value.startswith("@")), (claim.name, key)
    assert published.numbers("overall-20x")["fp32_gb"] == 26.84
    assert published.numbers("vit-h14-fsdp")["gb"] == 17.2


def test_audited_claims_say_text_and_logs() -> None:
    audited = {c.name: c.audit for c in CLAIMS if c.audit}
    assert {"overall-20x", "16-mixed-time", "init-module-load", "course-quarter", "distilbert-memory"} <= set(audited)
    assert audited["overall-20x"] == {"text": "20x", "logs": "26.84 / 2.02 = 13.3x"}


# --- the accuracy tolerances catch what they must ---------------------------------------------------

MUTATIONS = [("fabric-accuracy", "lr-div10"), ("grad-accum-accuracy", "accumulation-never-zeroed")]


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(("name", "mutation"), MUTATIONS, ids=[f"{n}:{m}" for n, m in MUTATIONS])
def test_accuracy_claim_fails_under_mutation(name: str, mutation: str, record_cache: RecordCache) -> None:
    """A learning rate 10x too low, or accumulated gradients never zeroed, in the candidate only, at
    the converged scale the cpu tier checks the claims on: the claim's measured tolerance
    (baselines/accuracy_spread.json) must not let it pass."""
    from memclaims.claims.accuracy import BY_CLAIM
    from memclaims.claims.accuracy import MUTATIONS as MAKE
    from memclaims.claims.catalogue import CLAIMS_BY_NAME
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    claim = CLAIMS_BY_NAME[name]
    candidate_t, reference_t = BY_CLAIM[name].on("cpu")
    reference = record_cache.get("cpu", record_cache.recipe("cpu", "vit", reference_t, CONVERGED))
    honest = record_cache.get("cpu", record_cache.recipe("cpu", "vit", candidate_t, CONVERGED))
    with MAKE[mutation]():
        mutated = run_recipe(record_cache.recipe("cpu", "vit", candidate_t, CONVERGED), RunOptions(device="cpu"))[0]
    records = {candidate_t: mutated, reference_t: reference}
    assert claim.check is not None
    assert claim.check.run("cpu", Lookup(records.__getitem__)).passed is False, (
        f"{mutation} left {name} passing: accuracy {mutated.accuracy} (unmutated {honest.accuracy}) vs "
        f"{reference.accuracy}")
    records[candidate_t] = honest
    assert claim.check.run("cpu", Lookup(records.__getitem__)).passed
    # The candidate's own baseline catches it too, even judged as after a library release: the
    # fault moves accuracy by points, past the noise measured for a release (memclaims.baselines.noise).
    from dataclasses import replace

    from memclaims.baselines.compare import ACCURACY
    from memclaims.baselines.noise import judge
    from memclaims.baselines.store import BaselineStore

    store = BaselineStore(ROOT / "baselines")
    found = store.find(mutated)
    assert found is not None, f"{mutated.recipe} has no committed baseline"
    released = replace(mutated, versions={**mutated.versions, "torch": "9.9.9"})
    verdict = judge(released, found[0].record, found[1], store.noise())
    assert ACCURACY in {r.metric for r in verdict.failures}, verdict.message()


def test_measured_tolerances_catch_the_mutations_they_were_measured_against() -> None:
    """memclaims/resources/accuracy_spread.json, regenerated: every claim must still fail under a learning
    rate 10x too high, and the accumulation claims under accumulation that never zeroes."""
    from memclaims.claims.accuracy import PAIRS, load

    spread = load()["claims"]
    assert {p.claim for p in PAIRS if "cpu" in p.tiers} == set(spread)
    for name, entry in spread.items():
        assert "lr-x10" in entry["mutations_caught"], (name, entry)
        if "grad-accum" in entry["candidate"]:
            assert "accumulation-never-zeroed" in entry["mutations_caught"], (name, entry)
        assert entry["smallest_drop_caught"] > 0, (name, entry)  # the suite's own seed passes
