"""The false-positive guard: Records that real releases and another CPU class measured (committed under
baselines/releases/, not edited) against the committed baselines must give no accuracy or loss
failure; memory may move (stale, or a real change the guard does not judge). The same tolerances
still fail the training faults (suite/cases/test_regressions.py, suite/cases/test_claims.py's mutations)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.baselines.compare import ACCURACY, LOSSES
from memclaims.baselines.noise import judge
from memclaims.baselines.store import BaselineStore
from memclaims.core.environment import environment_id
from memclaims.report.spread import read_records

RELEASES = ROOT / "baselines" / "releases"
GUARDED = (ACCURACY, LOSSES)


def _files() -> list[Path]:
    return sorted(RELEASES.glob("*.jsonl"))


def _reruns(path: Path) -> dict[str, dict[int, float]]:
    """recipe -> seed -> accuracy of the lines measured at another seed (``"seed"``: the reruns the
    suite would make in that environment where one run cannot decide an accuracy)."""
    found: dict[str, dict[int, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line) if line.strip() else {}
        if "seed" in entry and entry["record"].get("accuracy") is not None:
            found.setdefault(entry["recipe"], {})[int(entry["seed"])] = float(entry["record"]["accuracy"])
    return found


def test_the_guard_holds_real_releases_and_another_class() -> None:
    names = {path.stem for path in _files()}
    assert {"torch2.9.1-avx2", "torch2.15.0-avx2"} <= names, names
    assert any(name.endswith("-default") for name in names), names  # ATen's default class: another CPU


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_a_real_release_raises_no_accuracy_or_loss_failure(path: Path) -> None:
    store = BaselineStore(ROOT / "baselines")
    noise = store.noise()
    reruns = _reruns(path)
    judged = 0
    for tier, record in read_records(path):
        found = store.find(record)
        assert found is not None, f"{path.name}: {record.baseline_key} has no committed baseline"
        baseline, environment = found
        seeds = reruns.get(record.recipe, {})
        comparison = judge(record, baseline.record, environment, noise, overrides=baseline.tolerances,
                           case_id=f"{tier}:{record.baseline_key}", rerun=seeds.__getitem__ if seeds else None)
        false_alarms = [r for r in comparison.failures if r.metric in GUARDED]
        assert not false_alarms, f"{path.name} ({environment_id(record)}):\n{comparison.message()}"
        judged += sum(r.metric in GUARDED for r in comparison.results)
    assert judged >= 10, f"{path.name} holds too few accuracies and loss trajectories to guard anything"
