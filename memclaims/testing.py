"""Helpers for testing memclaims, and projects built on its pytest plugin.

* :func:`make_project`: a throwaway pytester project wired like a memclaims suite (the project's
  own pytest.ini with ``testpaths = .``, a conftest loading the plugin, the project importable).
* :func:`fake_record`: a complete Record with round numbers, for tests that need no training.

Imports pytest lazily: the library itself never needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from memclaims.record import Record

if TYPE_CHECKING:
    import pytest

# The plugin and the suite's fixtures (record cache, baseline check), as this project's conftest.py.
SUITE_CONFTEST = 'pytest_plugins = ["memclaims.pytest_plugin", "fixtures.records"]'
PLUGIN_CONFTEST = 'pytest_plugins = ["memclaims.pytest_plugin"]'
FAKE_PEAK = 10_485_760  # 10 MiB, so that the MiB figures in messages are easy to read
FAKE_VERSIONS = {"torch": "2.14.1", "torchvision": "0.29.1", "lightning": "2.6.6", "transformers": None,
                 "bitsandbytes": None, "torchmetrics": "1.8.0", "python": "3.12.3", "cuda": None}


def make_project(pytester: pytest.Pytester, root: Path, conftest: str = SUITE_CONFTEST,
                 ini_extra: str = "") -> pytest.Pytester:
    """Wire ``pytester``'s directory like the project at ``root``; returns ``pytester``."""
    ini = (root / "pytest.ini").read_text(encoding="utf-8").replace("testpaths = suite", "testpaths = .")
    pytester.makeini(ini + ini_extra)
    pytester.makeconftest(conftest)
    pytester.syspathinsert(root)
    return pytester


def fake_record(recipe: str = "vit-smoke/fake-a", **changes: Any) -> Record:
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
