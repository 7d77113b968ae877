"""Wires the pytest side: memclaims' options and hooks, and the fixtures of fixtures/."""

pytest_plugins = ["memclaims.pytest_plugin", "fixtures.records", "fixtures.claim_runs"]
