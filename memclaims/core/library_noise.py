"""Deprecation lines the installed libraries print about each other, kept out of memclaims' output.

torchao 0.18 registers its Enum settings with ``torch.utils._pytree.register_constant``, which torch 2.14
deprecates with a warning on torch's own logger at every import of torchao, and peft imports torchao
whenever it is installed: without a filter every command and pytest session that touches peft or the
``ao-*`` optimizers prints one ``W... _pytree.py`` line per Enum, about code neither memclaims nor its user
wrote. Only that message is dropped; every other line of the logger prints.

Standard library only: memclaims' import installs it, before torch is imported.
"""

from __future__ import annotations

import logging

# The logger torch's pytree module warns on, and the words of the one warning dropped.
PYTREE_LOGGER = "torch.utils._pytree"
ENUM_CONSTANT_DEPRECATION = "Calling register_constant() on Enum subclasses is deprecated"


class _DropEnumConstantDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return ENUM_CONSTANT_DEPRECATION not in record.getMessage()


def quiet_library_deprecations() -> None:
    """Drop the pytree Enum deprecation torchao's import triggers (idempotent)."""
    logger = logging.getLogger(PYTREE_LOGGER)
    if not any(isinstance(f, _DropEnumConstantDeprecation) for f in logger.filters):
        logger.addFilter(_DropEnumConstantDeprecation())
