"""``memclaims reproduce``'s size verdicts, row by row: each claim row holds on a world shaped like the
article and says "does not hold" when its own run is 1.5x heavier; the rows that do not read that run
keep holding. On the cpu tier (ratios derived from exact bytes) and the sim tier (published ratios)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import memclaims.report.reproduce as report
from fixtures.claim_worlds import fake_load, fake_run
from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe

# Which rows' claims read each row's run: its own claim, and the claim of the row measured against it.
READERS = {"01": {"01"}, "02": {"02", "03"}, "03": {"03", "04"}, "04": {"04", "05"},
           "05": {"05", "06"}, "06": {"06"}, "07-3": {"07-3"}}
CLAIM_ROWS = ("01", "02", "03", "04", "05", "06", "07-3")
TECHNIQUES = {row: techniques for row, _, techniques, _ in report.CHAIN_ROWS} | {"07-3": report.LOAD_RECIPE}
HEAVY = 1.5
MEMORY = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_reserved_total_bytes", "load_peak_bytes")


@pytest.fixture(autouse=True)
def no_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart is test_reproduce.py's business; these tests read the verdicts only."""
    monkeypatch.setattr(report, "_plot", lambda *args, **kwargs: None)


def _heavier(row: str) -> report.RunFn:
    def run(recipe: Recipe, device: str, evaluate: bool) -> Record:
        record = fake_run(recipe, device, evaluate)
        if recipe.techniques == TECHNIQUES[row]:
            heavier = {f: int(getattr(record, f) * HEAVY) for f in MEMORY if getattr(record, f) is not None}
            breakdown = {category: int(b * HEAVY) for category, b in record.breakdown.items()}  # the same tensors
            record = dataclasses.replace(record, **heavier, breakdown=breakdown)
        return record

    return run


def _reproduce(device: str, out: Path, run_fn: report.RunFn, monkeypatch: pytest.MonkeyPatch,
               load_factor: float = 1.0) -> dict[str, report.Row]:
    if device == "sim":
        import memclaims.sim.timemodel as timemodel

        monkeypatch.setattr(timemodel, "predicted_ratio", lambda candidate, reference: 1 / 6.1)
    # The sim's 07 rows come from its load-only replays.
    return {r.row: r for r in report.reproduce(device, out, run_fn=run_fn, load_fn=fake_load(load_factor))}


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_every_claim_row_holds_on_the_articles_world(device: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _reproduce(device, tmp_path, fake_run, monkeypatch)
    assert {r: rows[r].verdict for r in CLAIM_ROWS} == dict.fromkeys(CLAIM_ROWS, "holds"), \
        {r: rows[r].size for r in CLAIM_ROWS}
    assert rows["01-2"].verdict == rows["07-1"].verdict == "n/a"  # the references judge nothing
    data = json.loads((tmp_path / "reproduce.json").read_text())
    assert {r["row"]: r["verdict"] for r in data["rows"]}["05"] == "holds"


@pytest.mark.parametrize("device", ["cpu", "sim"])
@pytest.mark.parametrize("broken", CLAIM_ROWS)
def test_a_heavier_row_does_not_hold_and_only_its_readers_move(device: str, broken: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    load_factor = HEAVY if broken == "07-3" else 1.0  # on the sim the 07 rows are the load replay's
    rows = _reproduce(device, tmp_path, _heavier(broken), monkeypatch, load_factor)
    assert rows[broken].verdict == "does not hold", rows[broken].size
    assert "outside" in rows[broken].size or "above" in rows[broken].size, rows[broken].size
    untouched = [r for r in CLAIM_ROWS if r not in READERS[broken]]
    assert all(rows[r].verdict == "holds" for r in untouched), {r: rows[r].size for r in untouched}
    md = (tmp_path / "reproduce.md").read_text()
    assert f"| {broken} " in md and "does not hold" in md
    data = json.loads((tmp_path / "reproduce.json").read_text())
    assert {r["row"]: r["verdict"] for r in data["rows"]}[broken] == "does not hold"


def test_a_heavier_reference_breaks_the_rows_measured_against_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """01-2 (fp32 Fabric) has no claim of its own: a heavier 01-2 moves 01 (Fabric = PyTorch), 02 (measured
    against it) and, on the cpu, 03 (derived from its breakdown); the rows after keep holding."""
    rows = _reproduce("cpu", tmp_path, _heavier("01-2"), monkeypatch)
    assert {r: rows[r].verdict for r in ("01", "02", "03")} == dict.fromkeys(("01", "02", "03"), "does not hold")
    assert rows["01-2"].verdict == "n/a"
    assert all(rows[r].verdict == "holds" for r in ("04", "05", "06", "07-3")), {r: rows[r].size for r in rows}
