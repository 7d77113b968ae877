"""Host memory per step phase and the host steady state: the library parts, on scripted counters."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest

from memclaims.core.record import Record
from memclaims.measure import host_steady
from memclaims.measure.host import (
    GAINED,
    LEVEL,
    NO_MALLOC_COUNTER,
    PYTHON_BLOCKS,
    RSS,
    HostSteps,
    freeze_heap,
    keep_heap_frozen,
    read_counters,
)

MIB = 2**20


def _record(host_steps: dict[str, Any], accumulation_steps: int = 1) -> Record:
    required = {f.name: 0 for f in dataclasses.fields(Record)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    required.update(recipe="vit-smoke/fabric", workload="vit", scale="smoke", techniques=[], device="cpu",
                    device_name="cpu", probe="cpu-exact", precision="32-true", weights="random", data="digits",
                    versions={}, peak_reserved_bytes=None, accuracy=None, final_loss=None, nan_loss=False,
                    nan_step=None, step_time_s=None)
    return dataclasses.replace(Record(**required), accumulation_steps=accumulation_steps, host_steps=host_steps)


def _run(steps: int, leak: dict[str, int] | None = None, accumulation: int = 1,
         clean_gain: dict[str, int] | None = None) -> Record:
    """``steps`` steps through ``HostSteps`` over scripted counters: each phase gains ``clean_gain``
    (freed again between steps, as MemTracker's statistics are) plus ``leak`` (kept)."""
    state = {RSS: 100 * MIB, PYTHON_BLOCKS: 50_000}
    clean_gain = clean_gain or {"forward": 2400}
    host = HostSteps(read=lambda: dict(state))
    wrapped = host.wrap(lambda name: nullcontext())

    def phase(name: str) -> None:
        with wrapped(name):
            state[PYTHON_BLOCKS] += clean_gain.get(name, 0) + (leak or {}).get(name, 0) // (
                accumulation if name in ("forward", "backward") else 1)
            state[RSS] += 3 * MIB * (name == "forward") + (leak or {}).get(f"{name}:rss", 0)

    for _ in range(steps):
        for _ in range(accumulation):
            phase("forward")
            phase("backward")
        phase("optimizer_step")
        phase("zero_grad")
        # Between steps: what the phases gained legitimately is freed again (the leak is not).
        state[PYTHON_BLOCKS] -= sum(gain * (accumulation if name in ("forward", "backward") else 1)
                                    for name, gain in clean_gain.items())
        state[RSS] -= 3 * MIB * accumulation
    return _record(host.steps, accumulation)


def test_gains_and_levels_are_per_occurrence_and_signed() -> None:
    values = iter([{RSS: 10, PYTHON_BLOCKS: 5}, {RSS: 30, PYTHON_BLOCKS: 4},
                   {RSS: 30, PYTHON_BLOCKS: 4}, {RSS: 25, PYTHON_BLOCKS: 9}])
    host = HostSteps(read=lambda: next(values))
    entered = []

    @contextmanager
    def probe_phase(name: str) -> Iterator[str]:
        entered.append(name)
        yield name

    wrapped = host.wrap(probe_phase)
    with wrapped("forward") as inner:
        assert inner == "forward"  # the probe's own context passes through
    with wrapped("backward"):
        pass
    assert entered == ["forward", "backward"]
    assert host.steps[RSS] == {"forward": {GAINED: [20], LEVEL: [20]}, "backward": {GAINED: [-5], LEVEL: [15]}}
    assert host.steps[PYTHON_BLOCKS]["backward"] == {GAINED: [5], LEVEL: [4]}


def test_the_counters_read_this_process() -> None:
    counters = read_counters()
    assert counters[RSS] > 10 * MIB and counters[PYTHON_BLOCKS] > 1000
    kept = [(i, -i) for i in range(5000)]
    assert read_counters()[PYTHON_BLOCKS] - counters[PYTHON_BLOCKS] >= 5000
    del kept


@pytest.mark.requires(unsupported=NO_MALLOC_COUNTER)
def test_malloc_bytes_move_by_a_kept_buffer_and_back_when_it_is_freed() -> None:
    # 64 MiB against the process's own churn between two reads, either way. Read in a fresh process: in an
    # xdist worker, threads left by earlier tests (gloo's, torch's) moved the total by up to -4.9 MiB between
    # two reads, past the tolerance; alone, a process's churn is what the tolerance was sized for.
    program = ("from memclaims.measure.host import MALLOC, read_counters\n"
               "before = read_counters()[MALLOC]\nbuffer = bytes(64 * 2**20)\nheld = read_counters()[MALLOC]\n"
               "del buffer\nafter = read_counters()[MALLOC]\nprint(before, held, after)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    before, held, after = (int(word) for word in done.stdout.split())
    assert abs(held - before - 64 * MIB) < 4 * MIB, held - before
    assert abs(after - before) < 4 * MIB, after - before


def test_a_clean_run_is_steady_however_much_a_phase_gains_and_frees() -> None:
    record = _run(5, clean_gain={"forward": 2400, "backward": 1200, "zero_grad": -300})
    assert host_steady.growth_per_step(record, PYTHON_BLOCKS) == 0
    assert host_steady.growth_per_step(record, RSS) == 0
    assert host_steady.leak(record) is None


def test_objects_kept_per_step_fail_naming_the_phase_against_a_clean_run() -> None:
    clean = _run(5)
    leaky = _run(5, leak={"optimizer_step": 3000})
    assert host_steady.growth_per_step(leaky, PYTHON_BLOCKS) == 3000
    message = host_steady.leak(leaky, reference=clean)
    assert message is not None
    assert "vit-smoke/fabric" in message and "python_blocks" in message and "+3,000 blocks per step" in message
    assert "in phase optimizer_step (+3,000 blocks per step above a clean run" in message
    assert "rss_bytes" not in message


def test_without_a_reference_the_leak_still_fails_and_says_why_no_phase_is_named() -> None:
    message = host_steady.leak(_run(5, leak={"backward": 5000}))
    assert message is not None and "cannot name" in message and "backward" in message


def test_bytes_kept_per_step_fail_in_mib() -> None:
    message = host_steady.leak(_run(5, leak={"optimizer_step:rss": 8 * MIB}), reference=_run(5))
    assert message is not None and "rss_bytes +8,388,608 B (+8.00 MiB) per step" in message
    assert "in phase optimizer_step" in message


def test_growth_under_the_measured_noise_passes() -> None:
    below = host_steady.THRESHOLDS[PYTHON_BLOCKS]
    assert host_steady.leak(_run(5, leak={"forward": below})) is None
    assert host_steady.leak(_run(5, leak={"forward": below + 1})) is not None


def test_one_late_warm_up_jump_is_no_leak_but_a_steady_growth_is() -> None:
    record = _run(5)
    levels = record.host_steps[RSS]["optimizer_step"][LEVEL]
    levels[2:] = [level + 4 * MIB for level in levels[2:]]  # step 3 grew once, then held
    assert host_steady.growth_per_step(record, RSS) == 0
    assert host_steady.leak(record) is None


@pytest.mark.parametrize("accumulation", [2, 4])
def test_accumulation_steps_are_judged_per_optimizer_step(accumulation: int) -> None:
    clean = _run(5, accumulation=accumulation)
    assert host_steady.growth_per_step(clean, PYTHON_BLOCKS) == 0
    leaky = _run(5, leak={"backward": 4000}, accumulation=accumulation)
    assert host_steady.growth_per_step(leaky, PYTHON_BLOCKS) == 4000
    message = host_steady.leak(leaky, reference=clean)
    assert message is not None and "in phase backward (+4,000 blocks per step" in message


def test_too_few_steps_or_no_host_measurement_judges_nothing() -> None:
    assert host_steady.growth_per_step(_run(3, leak={"forward": 9000}), PYTHON_BLOCKS) is None
    assert host_steady.leak(_record({})) is None


def test_a_record_stored_before_host_steps_loads() -> None:
    raw = _run(5).to_dict()
    del raw["host_steps"]
    assert Record.from_dict(raw).host_steps == {}


def test_the_heap_is_frozen_once_until_a_run_unfreezes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_heap_frozen collects and freezes only after HostSteps.frozen unfroze the heap: before each of a session's
    tests it must cost nothing (asking the collector, gc.get_freeze_count, walks the permanent generation: 61 ms in a
    collected session), and after a run it must freeze again (or every later run collects the whole heap)."""
    import gc

    collections: list[int] = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or real_collect(*a))
    monkeypatch.setattr(gc, "get_freeze_count", lambda: pytest.fail("the state is kept, not asked of the collector"))
    freeze_heap()
    keep_heap_frozen()
    keep_heap_frozen()
    assert len(collections) == 1
    with HostSteps().frozen():
        pass
    keep_heap_frozen()
    keep_heap_frozen()
    assert len(collections) == 3  # the run's freeze, then one after it
