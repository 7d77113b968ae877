"""Helpers for testing memclaims, and projects built on its pytest plugin.

* :func:`make_project`: a throwaway pytester project wired like a memclaims suite (the project's
  own pytest.ini with ``testpaths = .``, the plugin, the project importable).
* :func:`register_unless_installed`: the plugin for a checkout that is not installed.
* :func:`fake_record`: a complete Record with round numbers, for tests that need no training.

Imports pytest lazily: the library itself never needs it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memclaims.core.record import Record

if TYPE_CHECKING:
    import pytest

PLUGIN_NAME = "memclaims"  # the plugin's pytest11 entry point (pyproject.toml)
# A conftest.py that loads the plugin where its entry point has not (see register_unless_installed).
CHECKOUT_CONFTEST = "from memclaims.pytest.testing import register_unless_installed as pytest_addhooks  # noqa: F401\n"
FAKE_PEAK = 10_485_760  # 10 MiB, so that the MiB figures in messages are easy to read
# The accuracy schedule of a run trained to its plateau (the converged scale): its accuracy is compared.
PLATEAU = {"kind": "epochs", "epochs": 8, "optimizer_steps": None, "test_examples": 359, "plateau": True}
FAKE_VERSIONS = {"torch": "2.14.1", "torchvision": "0.29.1", "lightning": "2.6.6", "transformers": None,
                 "bitsandbytes": None, "torchmetrics": "1.8.0", "python": "3.12.3", "cuda": None}


def register_unless_installed(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register memclaims' plugin under its entry point's name, unless pytest has loaded it already.

    For the ``conftest.py`` of a checkout run without installing memclaims (``PYTHONPATH=.``), as
    its ``pytest_addhooks`` hook (pytest calls it when it registers the conftest, before options
    are parsed). Installed (``pip install -e .``), the ``pytest11`` entry point has loaded the
    plugin and this does nothing: registering it a second time would be an error. ``-p no:memclaims``
    is respected."""
    from memclaims.pytest import plugin as pytest_plugin

    if pluginmanager.is_blocked(PLUGIN_NAME) or pluginmanager.is_registered(pytest_plugin):
        return
    pluginmanager.register(pytest_plugin, PLUGIN_NAME)


def make_project(pytester: pytest.Pytester, root: Path, conftest: str = CHECKOUT_CONFTEST,
                 ini_extra: str = "") -> pytest.Pytester:
    """Wire ``pytester``'s directory like the project at ``root``; returns ``pytester``."""
    ini = (root / "pytest.ini").read_text(encoding="utf-8").replace("testpaths = suite", "testpaths = .")
    pytester.makeini(ini + ini_extra)
    pytester.makeconftest(conftest)
    pytester.syspathinsert(root)
    return pytester


def fake_record(recipe: str = "vit-smoke/fake-a", **changes: object) -> Record:
    """A cpu-tier Record of a bf16-true smoke recipe; ``changes`` overrides any field."""
    values: dict[str, Any] = dict(
        recipe=recipe, workload="vit", scale="smoke", techniques=["bf16-true"], device="cpu",
        device_name="cpu-x86_64", probe="cpu", precision="bf16-true", batch_size=32, accumulation_steps=1,
        memory_steps=2, param_count=1000, param_tensor_count=4, param_bytes=2000, grad_bytes=2000,
        optimizer_state_bytes=4000, load_peak_bytes=3000, peak_allocated_bytes=FAKE_PEAK, peak_reserved_bytes=None,
        accuracy=0.5, final_loss=1.0, nan_loss=False, nan_step=None, step_time_s=0.1, weights="random",
        data="sklearn-digits", versions=dict(FAKE_VERSIONS))
    values.update(changes)
    return Record(**values)


def with_observed(record: Record, technique: str, **values: object) -> Record:
    """``record`` with ``values`` in ``technique``'s part of it (``Record.by_technique``), the rest as it was."""
    parts = {**record.by_technique, technique: {**record.by_technique.get(technique, {}), **values}}
    return dataclasses.replace(record, by_technique=parts)
