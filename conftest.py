"""This repository's pytest wiring.

memclaims' plugin (options, markers, hooks, fixtures, the environment preflight) loads through its
``pytest11`` entry point once the project is installed (``pip install -e ".[test]"``, as CI does).
Run from a checkout that is not installed (``PYTHONPATH=. pytest``), the hook below registers it
under the entry point's name; installed, it does nothing, so the plugin is never registered twice.
"""

from memclaims.pytest.testing import register_unless_installed as pytest_addhooks  # noqa: F401
