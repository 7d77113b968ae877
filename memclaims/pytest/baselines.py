"""The ``baseline_store`` and ``baseline_check`` fixtures: compare a case's Record with its stored
baseline, or store it. Part of memclaims' pytest plugin (registered by ``memclaims.pytest.plugin``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from memclaims.baselines.compare import (
    NO_BASELINE,
    OK,
    REFUSED,
    REGRESSION,
    UPDATED,
    Comparison,
    fmt_change,
    fmt_value,
)
from memclaims.baselines.noise import judge
from memclaims.baselines.store import Baseline, BaselineStore
from memclaims.core.environment import environment_id
from memclaims.core.errors import MemclaimsError
from memclaims.core.record import Record
from memclaims.measure.diagnosis import save_memory_failure
from memclaims.pytest.plugin import accept_command, settings, summary

_KEY_PROPERTIES = ("peak_allocated_bytes", "peak_reserved_bytes", "load_peak_bytes",
                   "optimizer_state_bytes", "accuracy", "step_time_s")


@dataclass
class BaselineCheck:
    config: pytest.Config
    store: BaselineStore

    def check(self, case_id: str, record: Record, record_property: Callable[[str, Any], None],
              rerun: Callable[[int], float] | None = None) -> None:
        """Fail on a regression; store under --update-baselines; a first run stores what it measured
        as obtained and fails once with the command that accepts it. ``rerun(seed)``: the case's
        accuracy at another seed, for an accuracy that one run after a change cannot judge
        (memclaims.baselines.noise)."""
        for name in _KEY_PROPERTIES:  # junit-xml properties, for CI dashboards
            record_property(name, getattr(record, name))
        environment = environment_id(record)
        record_property("baseline_environment", environment)
        try:
            found = self.store.find(record)
            if settings(self.config).update_baselines:
                self._update(case_id, record, environment, found)
                return
            if found is None:
                path = self.store.store_record(record, obtained=True)
        except MemclaimsError as error:
            unreadable = str(error)
        else:
            unreadable = ""
        if unreadable:  # failed outside the handler: pytest would print the message twice, chained
            pytest.fail(unreadable, pytrace=False)
        if found is None:
            summary(self.config).add_note(case_id, NO_BASELINE, environment)
            pytest.fail(f"{case_id}: no baseline for {record.baseline_key!r} in {self.store.path(environment)} "
                        f"(nor in a sibling class); what this run measured is in {path}: review it and "
                        f"accept it with `{accept_command(self.config, environment)}` (no rerun needed), "
                        f"then commit {self.store.path(environment).name}", pytrace=False)
        baseline, baseline_environment = found
        comparison = self._compare(case_id, record, baseline.record, baseline.tolerances, baseline_environment,
                                   rerun)
        summary(self.config).add(comparison)
        record_property("baseline_verdict", comparison.verdict)
        if comparison.failures:
            pytest.fail(self._with_diagnosis(comparison, record, baseline.record), pytrace=False)

    def reference(self, record: Record) -> Record | None:
        """The stored baseline Record of ``record``'s recipe, if any (an unreadable store: None,
        which ``check`` then reports)."""
        try:
            found = self.store.find(record)
        except MemclaimsError:
            return None
        return found[0].record if found else None

    def _compare(self, case_id: str, record: Record, baseline: Record, overrides: dict[str, float | None],
                 baseline_environment: str, rerun: Callable[[int], float] | None = None) -> Comparison:
        options = settings(self.config)
        return judge(record, baseline, baseline_environment, self.store.noise(), overrides=overrides,
                     case_id=case_id, time_threshold_pct=options.time_threshold, strict=options.strict, rerun=rerun)

    def _update(self, case_id: str, record: Record, environment: str,
                found: tuple[Baseline, str] | None) -> None:
        """--update-baselines: show old -> new, and never absorb a regression unless told to."""
        if found is None:
            self.store.store_record(record)  # raises (one line) when it cannot: the table then says nothing
            summary(self.config).add_note(case_id, UPDATED, environment)
            return
        baseline, baseline_environment = found
        comparison = self._compare(case_id, record, baseline.record, baseline.tolerances, baseline_environment)
        regressions = [r for r in comparison.results if r.verdict == REGRESSION]
        refused = bool(regressions) and not settings(self.config).accept_regressions
        if not refused:
            self.store.store_record(record)  # before the rows: the table never says updated for a failed write
        for row in comparison.rows():  # every changed metric, old -> new, under this machine's id
            if row["baseline"] != row["now"]:
                verdict = row["verdict"]
                row.update(environment=environment, verdict=REFUSED if refused and verdict == REGRESSION
                           else UPDATED if verdict == OK else verdict)
                summary(self.config).rows.append(row)
        if refused:
            lines = [f"{case_id}: --update-baselines refuses to absorb a regression:"]
            lines += [f"  {r.metric}: {fmt_value(r.metric, r.baseline)} -> {fmt_value(r.metric, r.now)} "
                      f"({fmt_change(r)})" for r in regressions]
            lines.append(f"environment since the baseline: {comparison.environment_change}")
            lines.append("if this is intended, rerun with --update-baselines --memclaims-accept-regressions")
            pytest.fail("\n".join(lines), pytrace=False)

    def _with_diagnosis(self, comparison: Comparison, record: Record, baseline: Record) -> str:
        message = comparison.message()
        memory = [r.metric for r in comparison.failures if r.metric.endswith("_bytes")]
        if memory:  # save what a person needs to diagnose it without rerunning
            try:
                saved = save_memory_failure(settings(self.config).artifacts, comparison.case_id, record,
                                            baseline, memory)
                message += "\ndiagnosis saved: " + ", ".join(str(p) for p in saved)
            except OSError as error:  # never let a full disk hide the regression itself
                message += f"\ndiagnosis not saved: {error}"
        return message


@pytest.fixture(scope="session")
def baseline_store(request: pytest.FixtureRequest) -> BaselineStore:
    """Yields the BaselineStore over ``--memclaims-baselines-dir`` (default ``baselines/``).

    Session scope: the store caches each environment's baseline file, so a run reads it once for
    all its cases, and ``--update-baselines`` writes go through the same cache.
    """
    return BaselineStore(settings(request.config).baselines_dir)


@pytest.fixture
def baseline_check(request: pytest.FixtureRequest, baseline_store: BaselineStore) -> BaselineCheck:
    """Yields a BaselineCheck: ``check(case_id, record, record_property)`` compares the case's Record
    with its stored baseline and fails the case with the message (under ``--update-baselines`` it
    stores the Record instead).

    Function scope: it writes junit-xml properties through the calling test's ``record_property``;
    the store behind it is the session's ``baseline_store``.
    """
    return BaselineCheck(request.config, baseline_store)

