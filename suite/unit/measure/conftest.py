"""Fixtures of suite/unit/measure/: ``fake_cuda`` (fixtures/fake_fabric.py), a GPU machine whose Fabric is recorded."""

from fixtures.fake_fabric import fake_cuda  # noqa: F401  (offered to this folder's tests)
