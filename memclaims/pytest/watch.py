"""The ``memclaims_watch`` fixture: the user's own training, watched in the user's own test and judged as memclaims'
cases are. Part of memclaims' pytest plugin (registered by ``memclaims.pytest.plugin``).

    def test_my_training(memclaims_watch):
        model, optimizer = build()
        with memclaims_watch(model, optimizer):
            train(model, optimizer)              # judged when the block ends

The Record (``memclaims.watching``) is named after the test (its node id: the baseline key) and then judged in this
order: the phases every step has were seen (``PhasesNotSeen``); no step phase grows from step to step (the leak check
of ``memclaims.measure.steady``); under ``@pytest.mark.memclaims_budget("24 GiB")`` the run's peak is within the
budget; and the Record against the baseline stored for it under ``--memclaims-baselines-dir``, through the cases'
``baseline_check`` (the same tolerances, direction, environment-change message, ``obtained`` file and ``memclaims
baselines accept``; ``--update-baselines`` stores it). A stack's callback gives its Record to ``judge``:
``memclaims_watch.judge(watched.record)`` after ``trainer.train()`` with ``TrainerWatch`` or ``LightningWatch``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pytest

from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.measure.steady import leak

if TYPE_CHECKING:  # the fixture asks pytest for baseline_check by name: no import of the plugin's modules here
    from memclaims.pytest.baselines import BaselineCheck

BUDGET_MARKER = "memclaims_budget"
# The peak a budget bounds, by device: what the allocator reserved on CUDA (what the card must hold, as pytest-memray's
# limit bounds what the process allocated), the exact live tensor bytes on the CPU.
BUDGET_METRIC = {"cuda": "reserved_bytes", "cpu": "allocated_bytes"}
_STEP_PHASES = ("load", "forward", "backward", "optimizer_step", "zero_grad", "evaluation")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{BUDGET_MARKER}(size, metric=None): the test's memclaims_watch fails when its run's peak exceeds "
        "size ('24 GiB': binary; '24 GB': decimal): the peak reserved on CUDA, the peak allocated on the CPU")


def budget_bytes(text: str | int) -> int:
    """The marker's size in bytes (``24GiB``, ``24 GB``, or a number of bytes)."""
    if isinstance(text, int):
        return text
    from memclaims.report.fit import parse_size  # the one parser of sizes with units (fit's --memory)

    try:
        return parse_size(text)
    except UsageError as error:
        raise UsageError(f"@pytest.mark.{BUDGET_MARKER}: {str(error).removeprefix('--memory ')}") from None


def _size(value: int) -> str:
    return f"{value / 1e9:.4g} GB ({value / 2**30:.4g} GiB; {value:,} B)"


def over_budget(record: Record, budget: int, key: str | None = None) -> str | None:
    """One line naming the phase whose peak is above ``budget`` (the largest), the metric and both numbers; None
    within it."""
    key = key or BUDGET_METRIC.get(record.device, "allocated_bytes")
    peaks = {name: record.phases[name].get(key) for name in _STEP_PHASES if name in record.phases}
    measured = {name: value for name, value in peaks.items() if value is not None}
    if not measured:
        raise UsageError(f"@pytest.mark.{BUDGET_MARKER}: {record.recipe} measured no {key} on {record.device}; "
                         f"bound one of {sorted(set(BUDGET_METRIC.values()))}")
    phase = max(measured, key=lambda name: measured[name])
    if measured[phase] <= budget:
        return None
    return (f"{record.recipe}: phases.{phase}.{key} {_size(measured[phase])} is above the budget {_size(budget)} "
            f"by {_size(measured[phase] - budget)}")


class WatchFixture:
    """What ``memclaims_watch`` yields: call it like ``memclaims.watch`` (the Record judged at the block's end), or
    ``judge`` a Record a stack's callback made."""

    def __init__(self, request: pytest.FixtureRequest, check: BaselineCheck,
                 record_property: Callable[[str, object], None]) -> None:
        self.request, self.check, self.record_property = request, check, record_property
        self.name = request.node.nodeid
        self.record: Record | None = None

    def __call__(self, model: Any, optimizer: Any = None, *, device: Any = None, profile: str | None = None) -> _Judged:
        from memclaims.watching.session import Watch

        return _Judged(self, Watch(model, optimizer, device=device, name=self.name, profile=profile))

    def judge(self, record: Record | None) -> Record:
        """Fail the test on a leak, a budget exceeded, or a regression against its baseline; the Record, named after
        the test, otherwise."""
        if record is None:
            pytest.fail(f"{self.name}: no Record to judge: the watched training never ended (was the callback given "
                        "to the Trainer, and did train() or fit() run?)", pytrace=False)
        record = self.record = dataclasses.replace(record, recipe=self.name)
        found = leak(record)
        if found:
            pytest.fail(found, pytrace=False)
        marker = self.request.node.get_closest_marker(BUDGET_MARKER)
        if marker is not None:
            if not marker.args:
                raise UsageError(f"@pytest.mark.{BUDGET_MARKER} needs a size, e.g. @pytest.mark.{BUDGET_MARKER}"
                                 "('24 GiB')")
            message = over_budget(record, budget_bytes(marker.args[0]), marker.kwargs.get("metric"))
            if message:
                pytest.fail(message, pytrace=False)
        self.check.check(self.name, record, self.record_property)
        return record


class _Judged:
    """``memclaims.watch`` whose end judges the Record (only where the block itself raised nothing)."""

    def __init__(self, fixture: WatchFixture, watch: Any) -> None:
        self.fixture, self.watch = fixture, watch

    def __enter__(self) -> Any:
        return self.watch.__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        refused = None
        try:
            self.watch.__exit__(kind, error, trace)
        except UsageError as usage:  # the sim's value read or bitsandbytes: its one line, no traceback
            refused = str(usage)
        if refused is not None:  # from None: the with-block's own error (the fake tensor's) is not shown under it
            raise pytest.fail.Exception(refused, pytrace=False) from None
        if error is None:
            self.fixture.judge(self.watch.record)


@pytest.fixture
def memclaims_watch(request: pytest.FixtureRequest, baseline_check: BaselineCheck,
                    record_property: Callable[[str, object], None]) -> Iterator[WatchFixture]:
    """Yields a WatchFixture: ``with memclaims_watch(model, optimizer): train()`` watches the training and judges its
    Record (phases seen, no leak, the ``memclaims_budget`` marker, the stored baseline); ``memclaims_watch.judge(
    record)`` judges a Record of ``TrainerWatch`` / ``LightningWatch``. A watch the test left open (a Trainer whose
    train() raised never ends its callback's) is closed at teardown: its hooks never outlive the test."""
    yield WatchFixture(request, baseline_check, record_property)
    from memclaims.watching.session import close_left_open

    close_left_open()
