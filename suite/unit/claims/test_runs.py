"""The verdicts of the last run: written by the pytest plugin, read by ``memclaims claims``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.claims import runs as claim_runs
from memclaims.cli import main
from memclaims.pytest.testing import CHECKOUT_CONFTEST

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A throwaway project with a suite/cases/test_claims.py whose verdicts are known in advance, and one
    external check the catalogue names (suite/cases/test_sharding.py::test_sharding_lowers_the_per_rank_peak)."""
    pytester.makeini((ROOT / "pytest.ini").read_text())
    pytester.makeconftest(CHECKOUT_CONFTEST)  # the plugin records the verdicts: nothing else to wire
    pytester.syspathinsert(ROOT)
    (pytester.path / "suite" / "cases").mkdir(parents=True)
    (pytester.path / "suite" / "cases" / "test_claims.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('case', ['cpu:fp16-range', 'sim:overall-20x', 'cpu:sgd-memory',\n"
        "    pytest.param('sim:batch-1-further-75', marks=pytest.mark.xfail(strict=True)),\n"
        "    pytest.param('gpu:bf16-supported', marks=pytest.mark.skip(reason='needs a CUDA GPU'))])\n"
        "def test_claim(case, record_property):\n"
        "    record_property('detail', 'numbers of ' + case)\n"
        "    assert case not in ('cpu:sgd-memory', 'sim:batch-1-further-75')\n")
    (pytester.path / "suite" / "cases" / "test_sharding.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_sharding_lowers_the_per_rank_peak(n):\n"
        "    assert n == 1\n")
    return pytester


def test_plugin_writes_each_verdict_and_the_cli_shows_them(project: pytest.Pytester, capsys,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # importlib mode, and none of the real suite's modules: this session may have imported the real
    # suite.cases.test_claims, which the throwaway project's module of the same name would resolve to.
    for name in [name for name in sys.modules if name == "suite" or name.startswith("suite.")]:
        monkeypatch.delitem(sys.modules, name)
    result = project.runpytest("-p", "no:cacheprovider", "--import-mode=importlib", "suite")
    result.assert_outcomes(passed=3, failed=2, skipped=1, xfailed=1)
    path = project.path / "memclaims-results" / claim_runs.LAST_RUN_NAME
    verdicts = json.loads(path.read_text())["verdicts"]
    assert verdicts["fp16-range@cpu"]["verdict"] == "holds"
    assert verdicts["fp16-range@cpu"]["detail"] == "numbers of cpu:fp16-range"
    assert verdicts["sgd-memory@cpu"]["verdict"] == "does not hold"
    assert verdicts["batch-1-further-75@sim"]["verdict"] == "does not hold (expected)"
    assert verdicts["bf16-supported@gpu"] == {**verdicts["bf16-supported@gpu"], "verdict": "skipped",
                                              "detail": "needs a CUDA GPU"}
    # A parametrized external check: one parameter failed, so the claim does not hold.
    assert verdicts["fsdp-memory@dist"]["verdict"] == "does not hold"
    assert verdicts["fsdp-memory@dist"]["nodeid"].startswith("suite/cases/test_sharding.py::test_sharding_lowers")

    assert main(["claims", "--artifacts", str(path.parent)]) == 0
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("sgd-memory "))
    # Printed in logs.md only (06 and 05's peaks); cpu failed; sim, gpu not run; dist not checked.
    assert line.split()[2:7] == ["logs", "FAIL", "-", "-", "."], line
    assert next(row for row in out.splitlines() if row.startswith("fp16-range ")).split()[2:4] == ["text", "ok"]
    assert next(row for row in out.splitlines() if row.startswith("vit-h14-fsdp ")).split()[2] == "figure"
    assert "text 20x; logs 26.84 / 2.02 = 13.3x" in out

    assert main(["claims", "--json", "--artifacts", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {row["claim"]: row for row in data["claims"]}
    assert rows["overall-20x"]["tiers"]["sim"]["verdict"] == "holds"
    assert rows["overall-20x"]["tiers"]["dist"] == {"not_checked": rows["overall-20x"]["tiers"]["dist"]["not_checked"]}
    assert rows["overall-20x"]["published"]["text_factor"] == 20
    assert rows["overall-20x"]["source_kind"] == "text+logs"  # 20x in the text, 2.02 GB in logs.md only
    assert rows["overall-20x"]["printed"] == {"end_gb": "logs", "fp32_gb": "text", "text_factor": "text"}
    assert rows["init-module-param-count"]["source_kind"] == "derived"
    assert data["coverage"]["total"] == len(rows) and data["coverage"]["nowhere"] < data["coverage"]["total"]


def test_a_case_parametrized_by_tier_speaks_for_its_tier_only() -> None:
    assert claim_runs.claims_of("suite/cases/test_technique_matrix.py::test_case[cpu:vit-smoke/bf16-true]") == [("chain-combines", "cpu")]
    assert claim_runs.claims_of("suite/cases/test_technique_matrix.py::test_case[gpu:vit-article/sgd]") == [("chain-combines", "gpu")]
    assert claim_runs.claims_of("suite/cases/test_claims.py::test_claim[sim:overall-20x]") == [("overall-20x", "sim")]
    assert claim_runs.claims_of("suite/cases/test_sim_article.py::test_record_fields") == []


def test_a_later_run_keeps_the_verdicts_it_did_not_renew(tmp_path: Path) -> None:
    path = tmp_path / claim_runs.LAST_RUN_NAME
    claim_runs.write(path, {"fp16-range@cpu": {"verdict": "holds", "session": "a"}})
    claim_runs.write(path, {"overall-20x@sim": {"verdict": "does not hold", "session": "b"}})
    assert set(claim_runs.read(path)) == {"fp16-range@cpu", "overall-20x@sim"}


def test_without_a_last_run_every_checked_tier_says_not_run(tmp_path: Path, capsys) -> None:
    assert main(["claims", "--artifacts", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert next(row for row in out.splitlines() if row.startswith("overall-20x ")).split()[2:7] == ["text+logs", "-", "-", "-", "."]
    assert "absent: no pytest run has checked a claim here yet" in out


def test_every_test_node_the_catalogue_names_exists() -> None:
    """A moved or renamed test breaks the catalogue's ``checks`` (and ``memclaims claims``' verdicts): caught here."""
    import re

    from memclaims.core import published

    named = [where for entry in published.claims() for where in entry["checks"].values() if where != "claims"]
    named += [reason for entry in published.claims() for reason in entry.get("not_on", {}).values()]
    missing = []
    for path, function in {match for text in named for match in re.findall(r"(suite/[\w/]+\.py)(?:::(\w+))?", text)}:
        file = ROOT / path
        # Defined there, or imported (the technique matrix takes its test_case from the plugin).
        if not file.exists() or (function and not re.search(rf"def {function}\(|import {function}\b", file.read_text())):
            missing.append(f"{path}::{function}" if function else path)
    assert named and missing == [], f"the catalogue names tests that do not exist: {sorted(missing)}"
