"""Interrupted baseline writers: a killed or Ctrl-C'd `--update-baselines` never tears a file.

A writer process stores baselines in a loop through BaselineStore.update (temp file + os.replace
under a flock), alternating between two contents, and is killed at staggered moments. Writing
baselines imports no torch, so a fresh interpreter per trial costs a fraction of a second.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from memclaims.baselines.store import Baseline, BaselineStore, dumps, parse
from memclaims.core.record import Record

ENV = "cpu-x86_64"
TRIALS = int(os.environ.get("MEMCLAIMS_KILL_TRIALS", "20"))  # more for a soak run
# Enough records that one write takes a while (about 100 kB), so kills land mid-write too.
RECORDS = 60


def _record(recipe: str, peak: int) -> Record:
    return Record(recipe=recipe, workload="vit", scale="smoke", techniques=["bf16-true"], device="cpu",
                  device_name=ENV, probe="cpu", precision="bf16-true", batch_size=32, accumulation_steps=1,
                  memory_steps=2, param_count=1000, param_tensor_count=4, param_bytes=2000, grad_bytes=2000,
                  optimizer_state_bytes=4000, load_peak_bytes=3000, peak_allocated_bytes=peak,
                  peak_reserved_bytes=None, accuracy=0.5, final_loss=1.0, nan_loss=False, nan_step=None,
                  step_time_s=0.1, weights="random", data="sklearn-digits",
                  versions={"torch": "2.14.1"}, breakdown={"parameters": 2000, "gradients": 2000})


def contents(which: int) -> dict[str, Baseline]:
    """Content 0 ("old") or 1 ("new"): every recipe's peak differs between the two."""
    return {f"vit-smoke/r{i:03d}": Baseline(_record(f"vit-smoke/r{i:03d}", 1_000_000 + i + which * 7_777))
            for i in range(RECORDS)}


def _writer(root: str) -> None:
    """Alternate the file between the two contents forever, through the public write API."""
    try:
        store = BaselineStore(root)
        which = 1
        store.update(ENV, contents(which))
        print("ready", flush=True)
        while True:
            which = 1 - which
            store.update(ENV, contents(which))
    except KeyboardInterrupt:
        os._exit(130)  # as a shell reports Ctrl-C


# A fresh interpreter per writer, as a real `pytest --update-baselines` is: a fork of this test
# session inherits its threads and signal state, and a forked writer was seen to ignore SIGINT.
# The writer also restores Python's Ctrl-C handler: Python keeps SIGINT ignored when its parent
# ignored it, as a non-interactive shell does for a background job (`pytest &`, nohup, some CI
# runners), and the writer then survived SIGINT whatever the machine's load.
_WRITER = f"import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); " \
          f"sys.path.insert(0, {str(Path(__file__).parent)!r}); " \
          "from test_store_interrupts import _writer; _writer(sys.argv[1])"


def _run_trial(root: Path, sig: int, delay_s: float) -> tuple[list[int], int | None]:
    """Start a writer, kill it with ``sig`` after ``delay_s``; its descendants and exit code."""
    process = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready and process.stdout.readline().strip() == "ready", "the writer never finished its first write"
        time.sleep(delay_s)
        descendants = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        os.kill(process.pid, sig)
        try:
            exitcode = process.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the writer survived {signal.Signals(sig).name} for 20 s")
    finally:
        if process.poll() is None:  # never leave the writer behind
            process.kill()
            process.wait(5)
        process.stdout.close()
    return descendants, exitcode


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killed_writer_leaves_old_or_new_file_and_no_orphans(tmp_path: Path, sig: int) -> None:
    store = BaselineStore(tmp_path)
    path = store.path(ENV)
    old, new = dumps(ENV, contents(0)), dumps(ENV, contents(1))
    path.parent.mkdir(parents=True)
    path.write_text(old)
    rng = random.Random(sig)  # staggered but reproducible delays, 0 to ~40 ms
    seen = {old: 0, new: 0}
    temps_left = 0
    for trial in range(TRIALS):
        descendants, exitcode = _run_trial(tmp_path, sig, trial * 0.002 + rng.random() * 0.002)
        assert exitcode == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
        text = path.read_text()
        assert text in seen, f"trial {trial}: the file is torn ({len(text)} chars, neither old nor new)"
        seen[text] += 1
        parse(text, path, ENV)  # and it parses as a valid store
        assert not [pid for pid in descendants if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], "orphan processes survived"
        temps = BaselineStore.temp_files(path)
        if sig == signal.SIGINT:
            # Ctrl-C raises KeyboardInterrupt in the writer, which removes its own temp file.
            assert not temps, f"trial {trial}: SIGINT left {temps}"
        temps_left += bool(temps)
    # The next writer (a later --update-baselines) removes what a SIGKILL'd one left behind.
    BaselineStore(tmp_path).update(ENV, contents(0))
    assert not BaselineStore.temp_files(path)
    assert path.read_text() == old
    print(f"{signal.Signals(sig).name} x{TRIALS}: old {seen[old]}, new {seen[new]}, "
          f"trials that left a temp file {temps_left}")


def test_stale_temp_file_is_ignored_by_readers_and_removed_by_the_next_writer(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.update(ENV, contents(0))
    path = store.path(ENV)
    # Exactly what a writer SIGKILLed between writing and os.replace leaves: a torn temp file.
    stale = path.parent / f".{path.name}.k1ll3d.tmp"
    stale.write_text(dumps(ENV, contents(1))[:500])
    assert BaselineStore(tmp_path).load(ENV) == contents(0)
    BaselineStore(tmp_path).update(ENV, {"vit-smoke/r000": contents(1)["vit-smoke/r000"]})
    assert not stale.exists()
    assert BaselineStore(tmp_path).load(ENV)["vit-smoke/r000"] == contents(1)["vit-smoke/r000"]
