"""This repository's pytest wiring.

memclaims' plugin (options, markers, hooks, fixtures, the environment preflight) loads through its
``pytest11`` entry point once the project is installed (``pip install -e ".[test,docs]" -c locks/ci.txt``,
as CI does). Run from a checkout that is not installed (``PYTHONPATH=. pytest``), the hook below
registers it under the entry point's name; installed, it does nothing, so the plugin is never
registered twice.

What only this repository's own suite needs lives here, not in the plugin users install: the header
line naming the lock the releases were installed from, and the ``reads_versions`` marker, which runs a
self-test once per set of installed releases of fixtures.releases (real, each tested package one release newer,
all newer, all older), and pytest-benchmark's reading of pytest.ini's ``--dist`` (fixtures.benchmark_dist).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memclaims.pytest.testing import register_unless_installed as pytest_addhooks  # noqa: F401

pytest_plugins = ["fixtures.releases", "fixtures.benchmark_dist"]
LOCK = Path(__file__).parent / "locks" / "ci.txt"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "reads_versions: a self-test of what memclaims reads as installed; runs once "
                                       "per set of fixtures.releases.RELEASE_SETS (fixture installed_releases)")
    config.addinivalue_line("markers", "stress: the dist tier's verdicts repeated in whole sessions; runs only under "
                                       "-m stress (suite/conftest.py)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    from memclaims.core.tested_versions import PACKAGES
    from memclaims.report.lock import header

    return [header(LOCK.relative_to(Path.cwd()) if LOCK.is_relative_to(Path.cwd()) else LOCK, (*PACKAGES, "peft"))]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("reads_versions"):
        from fixtures.releases import RELEASE_SETS

        metafunc.parametrize("installed_releases", list(RELEASE_SETS), indirect=True,
                             ids=[f"releases={s}" for s in RELEASE_SETS])
