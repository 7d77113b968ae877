"""Run one function on N ranks of a torch.distributed process group, and gather what each returned.

Two ways in, one entry point (``launch``):
- under torchrun (RANK, WORLD_SIZE, MASTER_ADDR and LOCAL_RANK set) this process *is* a rank: the
  function runs here, in the existing process group (created from the environment if needed), and
  the results of all ranks are gathered with ``all_gather_object``;
- otherwise ``launch`` spawns N fresh processes (``spawn``, never ``fork``: torch and CUDA state
  must not be copied), each joins a group on a free loopback port, and the parent collects one
  pickled result per rank from a private temporary folder.

Failure rules the suite depends on: a rank that raises or dies makes ``launch`` raise
``LaunchError`` with that rank's own error text as soon as the parent sees it (the others are
terminated, not waited for); a run whose ranks make no progress for ``timeout_s`` is terminated
(progress: a rank's ``beat()``, which every measured phase gives, so a loaded machine that runs
slowly is never stopped, a stalled rank is); and after success, failure or KeyboardInterrupt no
child process and no listening port is left behind.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from memclaims.core.errors import MemclaimsError, UsageError
from memclaims.measure.heartbeat import BEAT_EVERY_S, HEARTBEAT_ENV, beat

LOOPBACK = "127.0.0.1"
# Set in every rank this module spawns: its rank comes from here, not from a cluster scheduler.
SPAWNED_RANK_ENV = "MEMCLAIMS_SPAWNED_RANK"


def strip_slurm(environ: Any) -> list[str]:
    """Remove ``SLURM_*`` from a spawned rank's environment; returns the names removed.

    Inside a SLURM allocation every spawned rank inherits the job's ``SLURM_PROCID=0`` etc.;
    Lightning then detects SLURMEnvironment and each rank runs as global rank 0 on ``cuda:0``.
    The ranks were started here, so SLURM's view of the task is wrong for all of them.
    """
    names = [name for name in environ if name.startswith("SLURM_")]
    for name in names:
        del environ[name]
    return names
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")
_STOP_GRACE_S = 5.0  # how long a terminated child gets before it is killed

# fn(rank, world_size, *args) -> a picklable result
RankFunction = Callable[..., object]


class LaunchError(MemclaimsError):
    """A rank failed, died or the run timed out; the message carries the rank's own error text."""


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int | None


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The rank this process was started as by torchrun (or any launcher that sets its variables)."""
    env = os.environ if environ is None else environ
    if not all(env.get(name) for name in TORCHRUN_VARS):
        return None
    try:
        found = TorchrunEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
        )
    except ValueError:
        raise UsageError(
            "malformed torchrun environment: RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be "
            f"integers (got {', '.join(f'{n}={env.get(n)!r}' for n in (*TORCHRUN_VARS, 'MASTER_PORT'))})"
        ) from None
    if not 0 <= found.rank < found.world_size:
        raise UsageError(f"malformed torchrun environment: RANK={found.rank} with WORLD_SIZE={found.world_size}")
    return found


def free_port() -> int:
    """A TCP port that is free on the loopback interface now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def launch(fn: RankFunction, world_size: int, args: Sequence[object] = (), *, backend: str = "gloo",
           timeout_s: float | None, port: int | None = None) -> list[Any]:
    """``fn(rank, world_size, *args)`` on every rank; the results, indexed by rank; ``timeout_s``: how long the
    ranks may take (None: no limit; memclaims.recipes.run_options.DEFAULT_TIMEOUT_S for a run's).

    ``fn`` must be a module-level function (spawned children import it by name).
    """
    if world_size < 1:
        raise UsageError(f"--devices must be at least 1 (got {world_size})")
    env = torchrun_env()
    if env is not None:
        if env.world_size != world_size:
            raise UsageError(
                f"--devices {world_size} disagrees with torchrun's WORLD_SIZE={env.world_size}; "
                "leave --devices out or make them equal"
            )
        return _run_in_existing_group(fn, env, args, backend, timeout_s)
    return _spawn(fn, world_size, tuple(args), backend, timeout_s, port if port is not None else free_port())


# --- under torchrun ---------------------------------------------------------------------------


def _run_in_existing_group(fn: RankFunction, env: TorchrunEnv, args: Sequence[object], backend: str,
                           timeout_s: float | None) -> list[object]:
    import torch.distributed as dist

    created = not dist.is_initialized()
    if backend == "nccl":
        _pin_gpu(env.local_rank)
    if created:
        dist.init_process_group(backend=backend, timeout=_group_timeout(timeout_s))
    try:
        result = fn(env.rank, env.world_size, *args)
        gathered: list[object] = [None] * env.world_size
        dist.all_gather_object(gathered, result)
        return gathered
    finally:
        if created:  # leave a group we found as we found it
            dist.destroy_process_group()


# --- spawned ranks ----------------------------------------------------------------------------


def _heartbeat(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.alive"


def _group_timeout(timeout_s: float | None) -> timedelta | None:
    """None: torch's default collective timeout (no wall-clock limit on the run itself)."""
    return timedelta(seconds=timeout_s) if timeout_s is not None else None


def _child(rank: int, fn: RankFunction, world_size: int, port: int, backend: str, timeout_s: float | None,
           folder: str, args: tuple[object, ...]) -> None:
    """One spawned rank: join the group, run ``fn``, leave the result or the error text in ``folder``."""
    # The same variables torchrun sets, so that Lightning sees processes created externally and
    # never launches its own.
    out = Path(folder)
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      **{SPAWNED_RANK_ENV: "1", HEARTBEAT_ENV: str(_heartbeat(out, rank))})
    strip_slurm(os.environ)
    starting = threading.Event()
    # Importing torch and joining the group is progress however slowly a loaded machine does it (a peer
    # that never comes is bounded by the group's own timeout); from ``fn`` on, its phases beat.
    threading.Thread(target=_beat_until, args=(starting,), daemon=True).start()
    import torch.distributed as dist

    try:
        if backend == "nccl":
            _pin_gpu(rank)  # one node: the local rank is the rank
        # The timeout bounds every collective: a rank waiting on a dead peer errors out.
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=_group_timeout(timeout_s))
        starting.set()
        result = fn(rank, world_size, *args)
        partial = out / f"rank{rank}.pkl.part"
        partial.write_bytes(pickle.dumps(result))
        partial.rename(out / f"rank{rank}.pkl")  # atomic: the parent never reads half a result
    except BaseException:  # noqa: BLE001 - KeyboardInterrupt too: the parent must learn why
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # skip interpreter teardown, which can block on a broken process group
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _beat_until(done: threading.Event) -> None:
    while not done.wait(BEAT_EVERY_S):
        beat()


def _pin_gpu(local_rank: int) -> None:
    """NCCL needs each rank on its own GPU before the group forms (else every rank uses GPU 0)."""
    import torch

    torch.cuda.set_device(local_rank)


def _spawn(fn: RankFunction, world_size: int, args: tuple[object, ...], backend: str, timeout_s: float | None,
           port: int) -> list[object]:
    context = multiprocessing.get_context("spawn")
    processes: list[multiprocessing.process.BaseProcess] = []
    with tempfile.TemporaryDirectory(prefix="memclaims-ranks-") as folder:
        try:
            for rank in range(world_size):
                _heartbeat(Path(folder), rank).touch()  # the limit counts from the rank's start
                process = context.Process(
                    target=_child, name=f"memclaims-rank{rank}", daemon=True,
                    args=(rank, fn, world_size, port, backend, timeout_s, folder, args),
                )
                process.start()
                processes.append(process)
            _wait(processes, Path(folder), timeout_s)
            return [pickle.loads((Path(folder) / f"rank{rank}.pkl").read_bytes()) for rank in range(world_size)]
        finally:
            stop(processes)


def _idle_s(folder: Path, rank: int) -> float:
    """Seconds since the rank's last beat (wall clock: the heartbeat is a file's mtime)."""
    try:
        return max(0.0, time.time() - _heartbeat(folder, rank).stat().st_mtime)
    except OSError:
        return 0.0


def _wait(processes: list[multiprocessing.process.BaseProcess], folder: Path, timeout_s: float | None) -> None:
    """Until every rank is done; a rank that fails ends it at once, and so does a running rank whose last
    beat is ``timeout_s`` old (no progress), however long the run has taken in all."""
    while True:
        failed = [rank for rank, p in enumerate(processes) if p.exitcode not in (None, 0)]
        if failed:
            raise LaunchError(_failure_text(failed, processes, folder))
        running = {rank: p for rank, p in enumerate(processes) if p.exitcode is None}
        if not running:
            return
        left = math.inf
        if timeout_s is not None:
            idle = {rank: _idle_s(folder, rank) for rank in running}
            left = timeout_s - max(idle.values())
            if left <= 0:
                stalled = ", ".join(str(rank) for rank, seconds in idle.items() if seconds >= timeout_s)
                raise LaunchError(f"distributed run timed out after {timeout_s:g} s without progress on rank "
                                  f"{stalled}; ranks still running: {', '.join(str(rank) for rank in running)} "
                                  "(memclaims run --timeout SECONDS sets the limit, 0 for none)")
        multiprocessing.connection.wait([p.sentinel for p in running.values()], timeout=min(left, 1.0))


def _failure_text(failed: list[int], processes: list[multiprocessing.process.BaseProcess], folder: Path) -> str:
    """The failed ranks' own error text, the first to fail first (the others often only report
    that a peer went away)."""
    def when(rank: int) -> float:
        error = folder / f"rank{rank}.error"
        return error.stat().st_mtime if error.exists() else float("inf")

    parts = []
    for rank in sorted(failed, key=when):
        error = folder / f"rank{rank}.error"
        code = processes[rank].exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        text = error.read_text().strip() if error.exists() else "(no error text: the process died)"
        parts.append(f"rank {rank} of {len(processes)} failed ({how}):\n{text}")
    return "\n\n".join(parts)


def stop(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Terminate, then kill, every child still alive, and reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(_STOP_GRACE_S)
    for process in processes:
        if not process.is_alive():
            process.close()


# --- workers for the launcher's own tests -----------------------------------------------------
# They live in the library, not in a test module, so that spawned children can import them
# whatever import mode pytest runs in.


def check_worker(rank: int, world_size: int, behaviour: str = "all-reduce", arg: float = 0.0) -> object:
    """``all-reduce``: the sum of all ranks (proves the group works); ``pid``: this process id;
    ``raise``: raise on rank ``arg``; ``exit``: rank ``arg`` dies without a word; ``sleep``: every
    rank sleeps ``arg`` seconds; ``progress``: every rank works ``arg`` seconds, beating as a run's phases do."""
    import torch
    import torch.distributed as dist

    if behaviour == "all-reduce":
        value = torch.tensor([float(rank)])
        dist.all_reduce(value)
        return float(value.item())
    if behaviour == "pid":
        return os.getpid()
    if behaviour == "raise":
        if rank == int(arg):
            raise RuntimeError(f"deliberate failure on rank {rank}")
        dist.barrier()  # the healthy ranks wait on the dead one: the parent must not
        return rank
    if behaviour == "exit":
        if rank == int(arg):
            os._exit(7)
        dist.barrier()
        return rank
    if behaviour == "sleep":
        time.sleep(arg)
        return rank
    if behaviour == "progress":
        until = time.monotonic() + arg
        while time.monotonic() < until:
            time.sleep(BEAT_EVERY_S)
            beat()
        return rank
    raise ValueError(f"unknown behaviour {behaviour!r}")
