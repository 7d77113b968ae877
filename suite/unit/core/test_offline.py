"""memclaims.core.offline: the Hub's variables each front end sets, the line it prints, and what it puts back.
That the front ends set them before any Hub client is imported, and that nothing then reaches the network:
suite/e2e/test_offline.py."""

from __future__ import annotations

import logging

import pytest

from memclaims.core import offline

ALL_ON = dict.fromkeys(offline.HUB_VARIABLES, "1")


def test_offline_unless_asked_even_over_the_users_zero() -> None:
    environ = {"HF_HUB_OFFLINE": "0", "PATH": "/bin"}
    mode = offline.apply(False, "--memclaims-download", environ)
    assert environ == {**ALL_ON, "PATH": "/bin"} and mode.offline
    assert mode.line == ("memclaims: Hugging Face Hub offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, "
                         "HF_DATASETS_OFFLINE set to 1; --memclaims-download allows downloads)")
    offline.restore(mode, environ)
    assert environ == {"HF_HUB_OFFLINE": "0", "PATH": "/bin"}


@pytest.mark.parametrize("given", [{}, {"HF_HUB_OFFLINE": "0"}, {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}])
def test_asked_downloads_leave_the_users_environment_and_go_online(given: dict[str, str]) -> None:
    """Asked, and the user set nothing or HF_HUB_OFFLINE=0: downloads (huggingface_hub reads HF_HUB_OFFLINE
    first, TRANSFORMERS_OFFLINE only where it is unset)."""
    environ = dict(given)
    mode = offline.apply(True, "--download", environ)
    assert environ == given and not mode.offline
    assert mode.line == "memclaims: Hugging Face Hub online: downloads allowed (--download)"


@pytest.mark.parametrize("given", [{"HF_HUB_OFFLINE": "1"}, {"TRANSFORMERS_OFFLINE": "yes"}, {"HF_HUB_OFFLINE": "ON"}])
def test_asked_downloads_under_the_users_offline_say_why_it_stays_offline(given: dict[str, str]) -> None:
    environ = dict(given)
    mode = offline.apply(True, "--download", environ)
    assert environ == given and mode.offline
    ((name, value),) = given.items()
    assert mode.line == (f"memclaims: Hugging Face Hub offline: --download asks for downloads, but the environment "
                         f"sets {name}={value}")


def test_hub_offline_reads_as_huggingface_hub_does() -> None:
    import huggingface_hub.constants as constants

    for value in ("1", "true", "YES", "on", "0", "false", "", "maybe"):
        # huggingface_hub's own reading of the variable (the constant is fixed at its import).
        expected = constants._is_true(value)
        assert offline.hub_offline({"HF_HUB_OFFLINE": value}) == expected, value
    assert offline.hub_offline({"TRANSFORMERS_OFFLINE": "1"}) and not offline.hub_offline({})


def test_hub_mode_restores_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in offline.HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with offline.hub_mode(False, "--download"):
        assert all(os.environ[name] == "1" for name in offline.HUB_VARIABLES)
    assert not any(name in os.environ for name in offline.HUB_VARIABLES)


def test_hub_kernel_loggers_are_quiet_below_error_and_nothing_else() -> None:
    """memclaims (imported above) quiets the hub-kernel loggers on import; bitsandbytes' other loggers,
    and errors of these, still print."""
    for name in ("bitsandbytes.backends.cpu.ops", "kernels", "kernels._internals.hf_hub"):
        assert not logging.getLogger(name).isEnabledFor(logging.WARNING), name
        assert logging.getLogger(name).isEnabledFor(logging.ERROR), name
    assert logging.getLogger("bitsandbytes.optim").isEnabledFor(logging.WARNING)
