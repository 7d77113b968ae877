"""``memclaims history``: ten nights of summaries, a change injected on one night, found and attributed;
like compared with like (another CPU class, another selection)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memclaims.cli import main
from memclaims.report import history

VERSIONS = {"torch": "2.13.0", "lightning": "2.6.6", "transformers": "5.24.0", "python": "3.12.3"}
PEAK = 10_000_000


def row(case: str, metric: str, now: float, environment: str = "cpu-x86_64-avx2",
        tolerance: float | None = 0.005) -> dict[str, Any]:
    return {"case": case, "environment": environment, "metric": metric, "baseline": now, "now": now,
            "change_pct": 0.0, "change": "+0.00 %", "tolerance": tolerance, "verdict": "ok"}


def night(root: Path, index: int, rows: list[dict[str, Any]], versions: dict[str, str]) -> None:
    folder = root / f"night-{index:02d}"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "schema": 2, "rows": rows, "session": {"started": f"2026-11-{index + 10:02d}T02:00:00Z", "versions": versions}}))
    (folder / "claims-last-run.json").write_text(json.dumps({"schema": 1, "verdicts": {}}))  # not a summary


@pytest.fixture
def nights(tmp_path: Path) -> Path:
    """Ten nights: torch 2.13.0 -> 2.14.1 on night 6 grows one case's peak by 4 %; the same case on
    another CPU class sits at another value throughout; night 3 ran a smaller selection."""
    for i in range(10):
        versions = dict(VERSIONS, torch="2.14.1" if i >= 6 else "2.13.0")
        grown = PEAK * (1.04 if i >= 6 else 1.0) + i  # a few bytes of drift: within tolerance
        rows = [row("cpu:vit-smoke/bf16-true", "peak_allocated_bytes", grown),
                row("cpu:vit-smoke/bf16-true", "accuracy", 0.9 + 0.01 * (i % 2), tolerance=0.02),
                row("cpu:vit-smoke/bf16-true", "step_time_s", 0.1 * (1 + i), tolerance=None),  # reported only
                row("cpu:vit-smoke/bf16-true", "peak_allocated_bytes", PEAK / 2, environment="cpu-x86_64-default")]
        if i != 3:
            rows.append(row("cpu:vit-smoke/sgd", "peak_allocated_bytes", PEAK * 0.8))
        night(tmp_path, i, rows, versions)
    return tmp_path


def test_first_move_is_named_with_the_package_that_changed(nights: Path) -> None:
    trends = history.read_runs(nights)
    assert len(trends.runs) == 10
    [move] = trends.moves
    assert move.key == ("cpu-x86_64-avx2", "cpu:vit-smoke/bf16-true", "peak_allocated_bytes")
    assert move.run == 6 and trends.runs[6].path == nights / "night-06" / "summary.json"
    assert move.versions_changed == {"torch": ("2.13.0", "2.14.1")}
    # the other CPU class is its own series, and the night that skipped sgd leaves a gap, not a move
    assert [i for i, _ in trends.series[("cpu-x86_64-avx2", "cpu:vit-smoke/sgd", "peak_allocated_bytes")]] == \
        [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert len(trends.series[("cpu-x86_64-default", "cpu:vit-smoke/bf16-true", "peak_allocated_bytes")]) == 10


def test_history_command_prints_and_plots(nights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "history.png"
    assert main(["history", str(nights), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "10 runs in" in out
    assert ("run 6 (2026-11-16T02:00:00Z, night-06/summary.json): cpu:vit-smoke/bf16-true peak_allocated_bytes "
            "[cpu-x86_64-avx2]") in out
    assert "(+4.00 %, tolerance 0.50 %); changed since the run before: torch 2.13.0 -> 2.14.1" in out
    assert plot.stat().st_size > 10_000
    assert main(["history", str(nights), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["first_moves"][0]["versions_changed"] == {"torch": ["2.13.0", "2.14.1"]}


def test_the_plot_draws_what_moved_and_nothing_from_zero(nights: Path, tmp_path: Path) -> None:
    trends = history.read_runs(nights)
    assert list(history.drawn(trends)) == [("cpu-x86_64-avx2", "cpu:vit-smoke/bf16-true", "peak_allocated_bytes")]
    flat = tmp_path / "flat"
    for i in range(3):  # nothing moves; one series is 0 bytes throughout, another grows from 0
        night(flat, i, [row("cpu:vit-smoke/bf16-true", "peak_allocated_bytes", PEAK),
                        row("cpu:vit-smoke/bf16-true", "optimizer_state_bytes", 0)], VERSIONS)
    quiet = history.read_runs(flat)
    assert not quiet.moves and history.drawn(quiet) == {}  # not every flat series, drawn
    grown = tmp_path / "grown"
    for i in range(3):
        night(grown, i, [row("cpu:vit-smoke/bf16-true", "optimizer_state_bytes", 0 if i < 2 else PEAK)], VERSIONS)
    from_zero = history.read_runs(grown)
    assert from_zero.moves and history.drawn(from_zero) == {}  # no ratio to 0 bytes (not a 100 % drop)
    assert history.plot(from_zero, tmp_path / "h.png").stat().st_size > 5_000


@pytest.mark.parametrize("metric, before, now, tolerance, expected", [
    ("peak_allocated_bytes", 100, 100.4, 0.005, False), ("peak_allocated_bytes", 100, 99.4, 0.005, True),
    ("accuracy", 0.90, 0.915, 0.02, False), ("accuracy", 0.90, 0.87, 0.02, True),
    ("step_time_s", 1.0, 3.0, None, False), ("step_time_s", 1.0, 1.2, 10.0, True)])
def test_moved_reads_each_metric_s_tolerance_in_its_unit(metric: str, before: float, now: float,
                                                        tolerance: float | None, expected: bool) -> None:
    assert history.moved(metric, before, now, tolerance) is expected


def test_a_folder_without_summaries_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "other.json").write_text("{}")
    assert main(["history", str(tmp_path)]) == 2
    assert main(["history", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no memclaims summary JSON" in err[0] and "not a folder" in err[1]
