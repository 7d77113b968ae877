"""memclaims.core.library_noise: the pytree Enum deprecation dropped, every other line kept."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from memclaims.core import library_noise


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_only_the_enum_deprecation_is_dropped() -> None:
    library_noise.quiet_library_deprecations()
    library_noise.quiet_library_deprecations()  # idempotent: one filter
    logger = logging.getLogger(library_noise.PYTREE_LOGGER)
    assert sum(isinstance(f, library_noise._DropEnumConstantDeprecation) for f in logger.filters) == 1
    kept = _Kept()
    logger.addHandler(kept)
    try:
        logger.warning("<enum 'X'> is an Enum subclass ... %s and will be an error",
                       library_noise.ENUM_CONSTANT_DEPRECATION)
        logger.warning("another pytree warning")
    finally:
        logger.removeHandler(kept)
    assert kept.messages == ["another pytree warning"]


@pytest.mark.requires(packages="torchao")
def test_importing_torchao_after_memclaims_prints_no_pytree_line() -> None:
    done = subprocess.run([sys.executable, "-c", "import memclaims, torch, torchao"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "register_constant" not in done.stderr, done.stderr
