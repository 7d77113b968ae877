"""The README's test command groups tests with xdist_group (pytest.ini: --dist loadgroup): the converged
Records (memclaims.pytest.records' group), the CPU process groups of test_sharding.py and test_regressions.py's
clean Records are each measured by one worker. A pytest or pytest-xdist release that silently stops honouring
the groups doubles that work, in CI's 15 minutes, without failing a case: this fails instead."""

from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]


def test_every_test_of_an_xdist_group_runs_on_one_worker(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naddopts = --dist loadgroup\n")
    pytester.makepyfile(test_grouped="""
        import pytest

        pytestmark = pytest.mark.xdist_group("together")

        @pytest.mark.parametrize("n", range(6))
        def test_member(n):
            pass
    """)
    result = pytester.runpytest_subprocess("-n", "2", "-v", "-p", "no:cacheprovider", "-p", "no:memclaims")
    result.assert_outcomes(passed=6)
    workers = set(re.findall(r"\[(gw\d+)\] .*PASSED .*test_member", result.stdout.str()))
    assert len(workers) == 1, f"one xdist_group ran on {sorted(workers)}: --dist loadgroup ignored the mark"


def test_each_test_starts_with_the_heap_frozen() -> None:
    """suite/conftest.py freezes the heap before each test (gc.freeze), so the cpu tier's collections at phase
    boundaries scan only what a run made: a quarter of a smoke run's CPU. Lost silently (a hook renamed, another
    plugin's unfreeze), CI's tests take that much longer without failing a case: this fails instead."""
    import gc

    assert gc.get_freeze_count() > 0, "nothing frozen before this test: suite/conftest.py's pytest_runtest_setup did not run"
