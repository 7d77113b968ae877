"""The launcher's own guarantees: failures surface with the failing rank's text and never hang,
no child process or listening port survives, torchrun's environment is honoured."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import signal
import socket
import time
from collections.abc import Iterator

import psutil
import pytest

from memclaims.core.errors import UsageError
from memclaims.measure import launcher
from memclaims.measure.launcher import LaunchError, check_worker, launch, torchrun_env

pytestmark = [pytest.mark.dist, pytest.mark.cpu]

TIMEOUT_S = 60.0


def _tracker_pid() -> int | None:
    # multiprocessing's spawn start method keeps one resource tracker for the whole session.
    return getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)


@pytest.fixture
def no_children_left() -> Iterator[None]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    time.sleep(0.1)
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
             and p.status() != psutil.STATUS_ZOMBIE}
    assert after - before - {_tracker_pid()} == set()


def _port_is_free(port: int) -> bool:
    # SO_REUSEADDR: connections in TIME_WAIT do not count, only a live listener does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((launcher.LOOPBACK, port))
            sock.listen()
        except OSError:
            return False
    return True


@pytest.fixture
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*launcher.TORCHRUN_VARS, "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_ranks_form_a_group_and_return_results(no_torchrun, no_children_left) -> None:
    port = launcher.free_port()
    assert launch(check_worker, 2, ("all-reduce",), timeout_s=TIMEOUT_S, port=port) == [1.0, 1.0]
    assert _port_is_free(port)


def test_a_rank_that_raises_fails_the_run_with_its_error(no_torchrun, no_children_left) -> None:
    port = launcher.free_port()
    started = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1 of 2 failed") as failure:
        launch(check_worker, 2, ("raise", 1), timeout_s=TIMEOUT_S, port=port)
    # Rank 0 was blocked in a barrier on the dead rank: the parent did not wait for it.
    assert time.monotonic() - started < TIMEOUT_S / 2
    assert "RuntimeError: deliberate failure on rank 1" in str(failure.value)
    assert _port_is_free(port)


def test_a_rank_that_dies_silently_fails_the_run(no_torchrun, no_children_left) -> None:
    with pytest.raises(LaunchError, match=r"rank 0 of 2 failed \(exited with status 7\)"):
        launch(check_worker, 2, ("exit", 0), timeout_s=TIMEOUT_S)


def test_a_run_past_its_timeout_is_stopped(no_torchrun, no_children_left) -> None:
    started = time.monotonic()
    # One rank is enough to show the bound (each extra rank costs a torch import).
    with pytest.raises(LaunchError, match="timed out after 4 s without progress on rank 0; ranks still running: 0"):
        launch(check_worker, 1, ("sleep", 600), timeout_s=4)
    assert time.monotonic() - started < 30


def test_a_run_that_makes_progress_outlives_its_limit(no_torchrun, no_children_left) -> None:
    """The limit is on a stall, not on the run: a loaded machine's slow run that keeps beating (as every
    measured phase does) goes on past it; the start (a torch import, the group) counts as progress."""
    started = time.monotonic()
    assert launch(check_worker, 1, ("progress", 6), timeout_s=3) == [0]
    assert time.monotonic() - started > 6


def test_keyboard_interrupt_leaves_no_child_behind(no_torchrun, no_children_left) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(3)  # the ranks are starting or asleep by then: either way they must be cleaned up
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(check_worker, 1, ("sleep", 600), timeout_s=TIMEOUT_S)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_free_port_binds_loopback_only() -> None:
    port = launcher.free_port()
    assert 0 < port < 65536 and _port_is_free(port)


def test_torchrun_env_detection() -> None:
    full = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "LOCAL_RANK": "1", "MASTER_PORT": "29500"}
    assert torchrun_env(full) == launcher.TorchrunEnv(1, 2, 1, "10.0.0.1", 29500)
    for missing in launcher.TORCHRUN_VARS:
        assert torchrun_env({k: v for k, v in full.items() if k != missing}) is None
    assert torchrun_env({}) is None
    with pytest.raises(UsageError, match="malformed torchrun environment"):
        torchrun_env({**full, "RANK": "one"})
    with pytest.raises(UsageError, match="RANK=2 with WORLD_SIZE=2"):
        torchrun_env({**full, "RANK": "2"})


def test_under_torchrun_the_existing_group_is_used_without_spawning(monkeypatch, no_children_left) -> None:
    import torch.distributed as dist

    port = launcher.free_port()
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": launcher.LOOPBACK,
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    # The function runs in this very process, and the group it needed is gone afterwards.
    assert launch(check_worker, 1, ("pid",), timeout_s=TIMEOUT_S) == [os.getpid()]
    assert launch(check_worker, 1, ("all-reduce",), timeout_s=TIMEOUT_S) == [0.0]
    assert not dist.is_initialized()
    with pytest.raises(UsageError, match="disagrees with torchrun's WORLD_SIZE=1"):
        launch(check_worker, 2, ("pid",), timeout_s=TIMEOUT_S)
    # A group that exists already is used, and left alone.
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert launch(check_worker, 1, ("all-reduce",), timeout_s=TIMEOUT_S) == [0.0]
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
