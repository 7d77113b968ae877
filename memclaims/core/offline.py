"""The Hugging Face Hub offline unless the user asks for downloads, and hub-kernel noise kept quiet.

memclaims builds every model from a config and its data offline, so nothing it runs needs the Hub.
Yet the libraries it imports reach for it: bitsandbytes 0.50.2 asks ``kernels`` for a 4-bit CPU kernel
at import on CPUs with AVX512-BF16 (with ``kernels`` installed, two DNS look-ups of huggingface.co in
every process that imports it: issue #44), and a user's workload may call ``from_pretrained``. The
libraries' own switches stop that: ``HF_HUB_OFFLINE`` (huggingface_hub, which every Hub client here goes
through), ``TRANSFORMERS_OFFLINE`` (transformers; huggingface_hub reads it too) and
``HF_DATASETS_OFFLINE`` (datasets). Each library reads them once, when it is imported
(``huggingface_hub.constants.HF_HUB_OFFLINE`` is a constant), so the front ends set them first: the
command line in ``memclaims.cli.main``, the pytest plugin at its first hook, before the environment
preflight imports the stack; the ranks memclaims spawns and the subprocesses it starts inherit them.

Downloads are the existing ``download`` option (``--memclaims-download``, ``memclaims run
--download``): asked, memclaims leaves the variables as the user's environment has them, so a user who
set none, or ``HF_HUB_OFFLINE=0``, gets downloads, and one who set ``HF_HUB_OFFLINE=1`` stays offline.

Standard library only: the plugin calls it before torch or any Hub client is imported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass

# The variables each library reads at import, in the order of the line the front ends print.
HUB_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
# huggingface_hub's ENV_VARS_TRUE_VALUES: the spellings it reads as "on".
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})

# Loggers that print about hub kernels memclaims never asks for (it uses bitsandbytes' 8-bit optimizers,
# never its 4-bit CPU GEMM): bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community"
# (bitsandbytes/backends/cpu/ops.py, at import on AVX512-BF16 CPUs; no bitsandbytes variable turns the
# attempt off) and kernels' own "Skipping publisher trust check ... offline mode" when it is installed.
HUB_KERNEL_LOGGERS = ("bitsandbytes.backends.cpu.ops", "kernels")


def quiet_hub_kernels() -> None:
    """Keep the hub-kernel loggers below WARNING (errors still print); the libraries' own loggers, so
    every other line they print, and everything else on stderr, is untouched."""
    for name in HUB_KERNEL_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _on(value: str | None) -> bool:
    return value is not None and value.strip().upper() in _TRUE


def hub_offline(environ: Mapping[str, str]) -> bool:
    """Whether huggingface_hub imported under ``environ`` runs offline: its rule
    (``HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE``, the first that is set, read as true or false)."""
    return _on(environ.get("HF_HUB_OFFLINE") or environ.get("TRANSFORMERS_OFFLINE"))


@dataclass(frozen=True)
class HubMode:
    """What a front end decided for its process and its children, and what it says about it."""

    offline: bool  # whether huggingface_hub runs offline in this process's children (and here, if set first)
    line: str  # one line for the pytest header and ``memclaims run``
    before: tuple[tuple[str, str | None], ...]  # each variable before, for restore()


def describe(download: bool, option: str, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether the Hub runs offline under ``apply(download, option)``, and the one line that says so
    (the same before and after ``apply``: it sets the variables only where downloads are not asked for)."""
    environ = os.environ if environ is None else environ
    if not download:
        return True, (f"memclaims: Hugging Face Hub offline ({', '.join(HUB_VARIABLES)} set to 1; {option} allows "
                      "downloads)")
    if hub_offline(environ):
        given = ", ".join(f"{name}={environ[name]}" for name in HUB_VARIABLES if name in environ)
        return True, (f"memclaims: Hugging Face Hub offline: {option} asks for downloads, but the environment "
                      f"sets {given}")
    return False, f"memclaims: Hugging Face Hub online: downloads allowed ({option})"


def apply(download: bool, option: str, environ: MutableMapping[str, str] | None = None) -> HubMode:
    """Set the Hub's variables in ``environ`` (``os.environ``): each to ``1`` unless ``download``
    (``option``, as the front end spells it, e.g. ``--memclaims-download``) asks for downloads, when
    they stay as the user's environment has them. Also quiets the hub-kernel loggers."""
    environ = os.environ if environ is None else environ
    quiet_hub_kernels()
    before = tuple((name, environ.get(name)) for name in HUB_VARIABLES)
    is_offline, line = describe(download, option, environ)
    if not download:
        environ.update(dict.fromkeys(HUB_VARIABLES, "1"))
    return HubMode(is_offline, line, before)


def restore(mode: HubMode, environ: MutableMapping[str, str] | None = None) -> None:
    """Put the variables back as they were before ``apply`` (a front end called in-process: a test, a
    pytest session nested in another)."""
    environ = os.environ if environ is None else environ
    for name, value in mode.before:
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


@contextmanager
def hub_mode(download: bool, option: str) -> Iterator[HubMode]:
    """``apply`` for the duration of a command, then ``restore``."""
    mode = apply(download, option)
    try:
        yield mode
    finally:
        restore(mode)
