"""A class named by its import path (``"package.module:Class"``), imported when it is asked for.

A technique names the engine half it needs this way (a stack's driver, ``Stack.driver``): the technique's module
imports no engine (techniques load before the pytest plugin's preflight, and the claims import them), the engine half
imports its stack's library only when a recipe runs on it, and finding it is one lookup, not a ladder of names
(optimum-benchmark's ``_target_``, Hydra's ``instantiate``; here a class, not an instance). Written by hand: neither
is a dependency, and ``importlib`` plus a subclass check is all it takes.
"""

from __future__ import annotations

import importlib
from typing import TypeVar

from memclaims.core.errors import UsageError

T = TypeVar("T")


def target_class(path: str, base: type[T]) -> type[T]:
    """The class at ``path`` (``"module:Class"``), which must be a subclass of ``base``; UsageError naming the path
    and what is wrong otherwise."""
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise UsageError(f"{path!r} names no class: give 'package.module:Class'")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise UsageError(f"{path!r} names no class that can be imported ({type(error).__name__}: {error})") from None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise UsageError(f"{path!r} is not a {base.__name__}")
    return found
