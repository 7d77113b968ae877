"""pytest-benchmark under this repository's pytest.ini (``--dist loadgroup``, fixtures.benchmark_dist): plain
pytest times and saves a benchmark (docs/tiers.md's step-time command), and ``-n`` runs end without its
warning. pytester in-process on a one-line benchmark (no training)."""

from __future__ import annotations

import pytest

from fixtures.paths import ROOT
from memclaims.pytest.testing import CHECKOUT_CONFTEST, make_project

pytest_plugins = ["pytester"]

BENCHMARKED = """
def test_step(benchmark):
    benchmark.pedantic(sum, args=([1, 2, 3],), rounds=3, iterations=1)
"""
DISABLED = "Benchmarks are automatically disabled"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    make_project(pytester, ROOT, conftest=CHECKOUT_CONFTEST + 'pytest_plugins = ["fixtures.benchmark_dist"]\n')
    pytester.makepyfile(test_bench=BENCHMARKED)
    return pytester


def test_plain_pytest_times_and_autosaves_under_the_suites_ini(project: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A user's plain pytest has no xdist worker around it; this test may (CI's -n 2), and pytest-benchmark reads
    # the worker's environment variable as xdist at work.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert "--dist loadgroup" in (project.path / "tox.ini").read_text()  # the suite's own addopts
    storage = project.path / "saved"
    result = project.runpytest("-p", "no:cacheprovider", "--benchmark-autosave", f"--benchmark-storage={storage}")
    result.assert_outcomes(passed=1)
    text = "\n".join(result.outlines + result.errlines)
    assert DISABLED not in text and "benchmark: 1 tests" in text, text
    assert len(list(storage.rglob("0001_*.json"))) == 1


class BenchmarkState:
    """pytest-benchmark's verdict on the session's options, read at its end (its warning is a Python warning
    raised after the output pytester captures)."""

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.session = config._benchmarksession  # type: ignore[attr-defined]


@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")  # the inner asked-for one
def test_a_run_under_n_ends_without_the_benchmark_warning(project: pytest.Pytester) -> None:
    # --co: xdist starts no workers; pytest-benchmark still judges the options (and would warn at the end).
    quiet, asked = BenchmarkState(), BenchmarkState()
    project.runpytest("-p", "no:cacheprovider", "-n", "2", "--co", plugins=[quiet])
    assert quiet.session.disabled and not quiet.session.xdist_warning
    project.runpytest("-p", "no:cacheprovider", "-n", "2", "--co", "--benchmark-autosave", plugins=[asked])
    assert asked.session.xdist_warning  # a timing asked for under -n is not honoured: pytest-benchmark says so
