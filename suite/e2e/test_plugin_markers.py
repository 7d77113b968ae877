"""Tier markers select exactly their tier: ``-m cpu`` runs every cpu case and no other, and so on.

The plugin's technique matrix in a throwaway project (pytester), and the suite's own parameterized
claims and technique cases, whose markers are read as ``-m`` reads them."""

from __future__ import annotations

import re

import pytest

from fixtures.paths import ROOT
from memclaims.pytest.plugin import TIERS
from memclaims.pytest.testing import make_project

pytest_plugins = ["pytester"]
TIER_MARKERS = ("cpu", "sim", "gpu")
CASE_ID = re.compile(r"::test_case\[(\w+):")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    make_project(pytester, ROOT).makepyfile(test_cases="""
        def test_case(tier, techniques):
            assert techniques
    """)
    return pytester


def _case_tiers(result: pytest.RunResult) -> list[str]:
    return [m.group(1) for line in result.outlines if (m := CASE_ID.search(line))]


def test_each_marker_collects_its_tier_and_only_it(project: pytest.Pytester) -> None:
    everything = _case_tiers(project.runpytest("--collect-only", "-q", "--memclaims-matrix", "singles"))
    assert set(everything) == set(TIERS)
    for tier in TIERS:
        selected = _case_tiers(project.runpytest("--collect-only", "-q", "-m", tier, "--memclaims-matrix", "singles"))
        assert selected == [tier] * everything.count(tier), (tier, selected)
        others = _case_tiers(project.runpytest("--collect-only", "-q", "-m", f"not {tier}",
                                               "--memclaims-matrix", "singles"))
        assert tier not in others and len(others) == len(everything) - everything.count(tier)


def test_gpu_marker_runs_no_cpu_case(project: pytest.Pytester) -> None:
    """What a nightly GPU runner asks for: every case it runs is a gpu case."""
    result = project.runpytest("-m", "gpu", "--memclaims-matrix", "singles", "-v")
    ran = re.findall(r"::test_case\[(\w+):\S+\] (?:PASSED|SKIPPED|FAILED)", result.stdout.str())
    assert ran and set(ran) == {"gpu"}, ran


def test_the_suites_claim_and_technique_cases_carry_the_marker_of_their_id(pytester: pytest.Pytester) -> None:
    """suite/cases/test_claims.py and suite/cases/test_technique_matrix.py: a case whose id names a tier is marked with
    that tier and no other (``-m`` selects by marker, the id is what the user reads)."""
    recorder = pytester.inline_run("--collect-only", "-p", "no:cacheprovider", f"--rootdir={ROOT}",
                                   "-c", str(ROOT / "pytest.ini"), str(ROOT / "suite" / "cases" / "test_claims.py"),
                                   str(ROOT / "suite" / "cases" / "test_technique_matrix.py"))
    items = [item for call in recorder.getcalls("pytest_collection_finish") for item in call.session.items]
    cases = [item for item in items if "[" in item.name and item.name.split("[")[1].split(":")[0] in TIER_MARKERS]
    assert {item.name.split("[")[0] for item in cases} >= {"test_claim", "test_case"}
    for tier in TIER_MARKERS:
        assert any(item.name.split("[")[1].startswith(f"{tier}:") for item in cases), tier
    for item in cases:
        tier = item.name.split("[")[1].split(":")[0]
        marked = {m.name for m in item.iter_markers()} & set(TIER_MARKERS)
        assert marked == {tier}, (item.nodeid, marked)
