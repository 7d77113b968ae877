"""Wires the pytest side: memclaims' options and hooks, and the fixtures of fixtures/.

The environment preflight runs first: with a broken or mismatched install the run stops with one
line naming the packages, before any test module imports the training stack.
"""

import pytest

from memclaims.preflight import message, problems

_BROKEN = problems()

if _BROKEN:
    from memclaims.pytest_options import pytest_addoption  # noqa: F401 - the options still parse

    def pytest_configure(config: pytest.Config) -> None:
        raise pytest.UsageError(message(_BROKEN))
else:
    pytest_plugins = ["memclaims.pytest_plugin", "fixtures.records", "fixtures.claim_runs"]
