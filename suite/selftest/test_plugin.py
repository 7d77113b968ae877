"""The pytest side, end to end with pytester: ids, markers, skip reasons, options."""

from __future__ import annotations

from pathlib import Path

import pytest

from memclaims.testing import make_project

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A throwaway project wired exactly like this one, with a case test that does not train."""
    make_project(pytester, ROOT).makepyfile(test_cases="""
        def test_case(tier, techniques, record_cache):
            recipe = record_cache.recipe(tier, "vit", techniques)
            assert recipe.techniques == techniques
    """)
    return pytester


def test_ids_are_readable_and_carry_the_tier(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "-q", "--memclaims-matrix", "singles")
    result.stdout.fnmatch_lines(["*test_case?cpu:vit-smoke/bf16-true?*", "*test_case?gpu:vit-article/sgd?*"])


def test_markers_select_tiers(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-m", "cpu", "--memclaims-matrix", "singles", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 0 and "failed" not in outcomes


def test_gpu_cases_skip_with_what_they_need(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from memclaims import machine

    monkeypatch.setattr(machine, "cuda_device_count", lambda: 0)  # in-process run: any machine is GPU-less
    result = suite.runpytest("-m", "gpu", "--memclaims-matrix", "singles", "-rs")
    result.stdout.fnmatch_lines(["*needs a CUDA GPU: torch.cuda.is_available() is False*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) > 0 and set(outcomes) == {"skipped", "deselected"}, outcomes


def test_cpu_16_mixed_case_skips_at_collection_with_why(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-m", "cpu", "--memclaims-matrix", "singles", "-rs", "-k", "16-mixed and not bf16")
    result.stdout.fnmatch_lines(["*Lightning runs 16-mixed as bf16-mixed on the CPU*"])
    assert result.parseoutcomes().get("skipped") == 1, result.parseoutcomes()


def test_header_prints_how_many_cases_each_selection_holds(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "--memclaims-matrix", "full")
    result.stdout.fnmatch_lines(["memclaims: matrix 'full': * cases per workload and tier (singles *, default *, full *)*"])


def test_matrix_option_changes_the_number_of_cases(suite: pytest.Pytester) -> None:
    counts = {}
    for matrix in ("singles", "default"):
        result = suite.runpytest("--collect-only", "-q", "--memclaims-matrix", matrix)
        counts[matrix] = sum(1 for line in result.outlines if "::test_case[" in line)
    assert 0 < counts["singles"] < counts["default"]


def test_bad_matrix_value_is_a_usage_error(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--memclaims-matrix", "everything")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid choice: 'everything'*"])


def test_matrix_can_be_set_in_pytest_ini(suite: pytest.Pytester) -> None:
    make_project(suite, ROOT, ini_extra="memclaims_matrix = singles\n")
    result = suite.runpytest("--collect-only")
    result.stdout.fnmatch_lines(["memclaims: matrix 'singles'*"])


@pytest.mark.parametrize("flag, value", [("--memclaims-steps", "three"), ("--memclaims-steps", "0"),
                                         ("--memclaims-accuracy-epochs", "-1")])
def test_malformed_counts_are_usage_errors(suite: pytest.Pytester, flag: str, value: str) -> None:
    result = suite.runpytest(flag, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{flag}*must be a positive integer, got '{value}'*"])
