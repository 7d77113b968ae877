"""The stress run of issue #44 item 1: every dist-tier verdict CI runs, ten times, with no failure.

The verdicts are the per-rank baselines of ``suite/cases/test_sharding.py`` (each rank's Record, every phase's
peaks, against ``recipe@2/rankN``) and every other test of the dist tier that CI's ``-m "not slow"`` runs on
the CPU (the DDP ranks' all-reduced gradients, the shards' exact bytes, the losses against the single
process, the launcher's). Each run is a whole pytest session of its own, started afresh as CI starts it, so
that what varies between processes (the ranks' start, gloo's threads, the load of the machine) varies here
too; one session repeating a test would measure its cached Records once. Any failed, errored or skipped
verdict in any run fails this test, listing each with its run and its message.

Only ``pytest -m stress`` runs it (suite/conftest.py deselects it otherwise): the nightly's own step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fixtures.paths import ROOT

RUNS = 10
# CI's dist tier on the CPU: CI runs `pytest -n 2 -m "not slow"`; its gpu cases skip without CUDA.
SELECTION = "dist and not gpu and not slow"
# The per-rank baselines every run must have judged, at least (a run that skips them proves nothing).
PER_RANK = "suite/cases/test_sharding.py::test_every_rank_against_its_baseline"
RUN_LIMIT_S = 1200  # one session; measured about 90 s alone on 2 cores, several minutes under the others' load


@dataclass
class Session:
    """One run: what passed, and each failure, error or skip with its first line."""

    run: int
    seconds: float
    returncode: int
    passed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_junit(path: Path, run: int, seconds: float, returncode: int) -> Session:
    """A session's outcomes from pytest's JUnit XML (``--junitxml``)."""
    session = Session(run, seconds, returncode)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            session.passed.append(node)
        else:
            first = (outcome.get("message") or outcome.text or "").strip().splitlines()
            session.problems.append(f"run {run}: {outcome.tag} {node}: {first[0] if first else ''}")
    return session


def judge(sessions: list[Session]) -> list[str]:
    """Every problem of every run; a run that exited non-zero without one, or judged no per-rank baseline, or
    another set of verdicts than the first run, is one too."""
    problems = [problem for session in sessions for problem in session.problems]
    for session in sessions:
        if session.returncode != 0 and not session.problems:
            problems.append(f"run {session.run}: pytest exited {session.returncode}")
        if not any(node.startswith(PER_RANK) for node in session.passed):
            problems.append(f"run {session.run}: no per-rank baseline was judged")
        if sorted(session.passed) != sorted(sessions[0].passed) and not session.problems:
            problems.append(f"run {session.run}: passed {len(session.passed)} verdicts, run 1 {len(sessions[0].passed)}")
    return problems


def test_the_judge_finds_every_kind_of_bad_run(tmp_path: Path) -> None:
    """The stress run's reading of a session, on constructed JUnit files (runs in CI: no session started)."""
    xml = tmp_path / "run.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="suite.cases.test_sharding" name="test_every_rank_against_its_baseline[cpu:a]"/>'
        '<testcase classname="suite.cases.test_sharding" name="test_every_rank_against_its_baseline[cpu:b]">'
        '<failure message="dist-cpu:vit-smoke/ddp@2/rank1: load_peak_bytes got worse than its baseline">x</failure>'
        '</testcase><testcase classname="suite.unit.measure.test_launcher" name="test_x"><skipped message="no"/>'
        '</testcase></testsuite></testsuites>')
    bad = read_junit(xml, 3, 1.0, 1)
    assert bad.passed == [f"{PER_RANK}[cpu:a]"]
    assert bad.problems == [
        f"run 3: failure {PER_RANK}[cpu:b]: dist-cpu:vit-smoke/ddp@2/rank1: load_peak_bytes got worse than its baseline",
        "run 3: skipped suite/unit/measure/test_launcher.py::test_x: no"]
    good = Session(1, 1.0, 0, passed=[f"{PER_RANK}[cpu:a]", f"{PER_RANK}[cpu:b]"])
    assert judge([good, Session(2, 1.0, 0, passed=list(good.passed))]) == []
    assert judge([good, bad]) == bad.problems
    assert judge([good, Session(2, 1.0, 2)]) == ["run 2: pytest exited 2", "run 2: no per-rank baseline was judged",
                                                "run 2: passed 0 verdicts, run 1 2"]


@pytest.mark.stress
@pytest.mark.slow
def test_every_dist_verdict_ci_runs_passes_ten_runs_of_ten(tmp_path: Path, record_property) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this session's xdist worker
    sessions: list[Session] = []
    began = time.monotonic()
    for run in range(1, RUNS + 1):
        junit = tmp_path / f"run{run}.xml"
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", SELECTION,
                               f"--junitxml={junit}", "--memclaims-artifacts", str(tmp_path / f"artifacts{run}")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S, check=False)
        seconds = time.monotonic() - start
        if not junit.exists():
            sessions.append(Session(run, seconds, done.returncode, problems=[
                f"run {run}: no JUnit file; pytest exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}"]))
            continue
        sessions.append(read_junit(junit, run, seconds, done.returncode))
    wall = time.monotonic() - began
    problems = judge(sessions)
    verdicts = len(sessions[0].passed)
    record_property("stress", {"runs": RUNS, "verdicts_per_run": verdicts, "failures": len(problems),
                               "wall_s": round(wall, 1), "run_s": [round(s.seconds, 1) for s in sessions]})
    print(f"\nmemclaims stress: {RUNS} runs of {verdicts} dist-tier verdicts, {len(problems)} failures, "
          f"{wall:.0f} s ({', '.join(f'{s.seconds:.0f}' for s in sessions)} s per run)")
    assert problems == [], f"{len(problems)} failures in {RUNS} runs:\n" + "\n".join(problems)
