"""``memclaims reproduce`` and ``baselines calibrate`` on constructed runs (no training)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

from memclaims.baselines import BaselineStore
from memclaims.recipe import Recipe
from memclaims.record import Record
from memclaims.report import calibrate, reproduce
from suite.selftest.test_baselines import PEAK, fake_record
from suite.selftest.test_claim_checks import _article, _cpu


def fake_run(recipe: Recipe, device: str, evaluate: bool) -> Record:
    """The cpu world of test_claim_checks (every row as its derivation says), 16-mixed run as bf16-mixed."""
    techniques = ("bf16-mixed",) if recipe.techniques == ("16-mixed",) and device == "cpu" else recipe.techniques
    record = _cpu(techniques) if device == "cpu" else _article(recipe.techniques, device)
    return dataclasses.replace(record, recipe=recipe.id, techniques=list(recipe.techniques),
                               precision="bf16-mixed" if techniques == ("bf16-mixed",) else recipe.precision)


def test_reproduce_writes_markdown_json_and_chart(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    from memclaims.recipe import resolve

    store.store_record(fake_run(resolve("vit", "smoke", ("fabric",)), "cpu", True))
    rows = reproduce("cpu", tmp_path / "out", run_fn=fake_run, store=store)
    assert [r.row for r in rows] == ["01", "01-2", "02", "03", "04", "05", "06", "07-1", "07-2"]
    assert [r.kind for r in rows] == ["train"] * 7 + ["load"] * 2
    assert all(r.verdict == "holds" for r in rows if r.claim), [(r.row, r.size) for r in rows]
    assert rows[2].ran_as.startswith("bf16-mixed (asked 16-mixed")
    md = (tmp_path / "out" / "reproduce.md").read_text()
    assert "| 02 02_mixed-precision | 16-mixed | bf16-mixed (asked 16-mixed" in md
    assert "| 04 04_lower-batchsize | + small-batch | as asked | 5.69 |" in md
    assert "## Model loading (07)" in md and "| 07-2 07_02 load (init_module, 16-true) | init-module | 0.65 |" in md
    assert "holds: within band" in md
    assert "text 20x, logs 26.84 / 2.02 = 13.3x, this run" in md
    assert "text 50 %, logs 1 - 0.65 / 1.24 = 47.6 %, this run 50.0%" in md
    data = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert data["published_unit"] == "GB reserved (decimal)" and data["rows"][1]["measured_ratio"] == 1.0
    assert data["rows"][1]["baseline_bytes"] == data["rows"][1]["measured_bytes"]
    assert (tmp_path / "out" / "reproduce.png").read_bytes()[:4] == b"\x89PNG"


def test_reproduce_says_outside_the_band_and_by_how_much(tmp_path: Path) -> None:
    def heavy_accumulation(recipe: Recipe, device: str, evaluate: bool) -> Record:
        record = fake_run(recipe, device, evaluate)
        if recipe.techniques == ("bf16-true", "small-batch", "grad-accum"):  # 15 % over its derived ratio
            record = dataclasses.replace(record, peak_allocated_bytes=int(record.peak_allocated_bytes * 1.25))
        return record

    rows = {r.row: r for r in reproduce("cpu", tmp_path, run_fn=heavy_accumulation)}
    assert rows["05"].verdict == "does not hold"
    assert "outside, 0.150 above" in rows["05"].size, rows["05"].size
    assert "does not hold: outside, 0.150 above" in (tmp_path / "reproduce.md").read_text()


def test_reproduce_on_the_sim_compares_with_published_ratios(tmp_path: Path, monkeypatch) -> None:
    import memclaims.timemodel as timemodel
    from suite.selftest.test_claim_checks import _fake_load

    _fake_load(monkeypatch, 1.0)
    monkeypatch.setattr(timemodel, "predicted_ratio", lambda candidate, reference: 1 / 6.1)
    rows = {r.row: r for r in reproduce("sim", tmp_path, run_fn=fake_run)}
    assert all(r.verdict == "holds" for r in rows.values() if r.claim), {k: r.size for k, r in rows.items()}
    assert "published 0.412" in rows["04"].size  # 5.69 / 13.82
    assert rows["07-2"].measured_ratio == rows["07-2"].published_ratio  # the load replay's reserved peaks
    md = (tmp_path / "reproduce.md").read_text()
    assert "text 6x faster, logs 17.88 / 3.45 = 5.2x, this run (roofline on the simulated A100" in md
    assert "GB reserved (decimal), predicted" in md and "| 02 02_mixed-precision | 16-mixed | as asked | 18.21 |" in md


def test_calibrate_stores_spread_with_a_floor(tmp_path: Path) -> None:
    peaks = itertools.cycle([PEAK, int(PEAK * 1.02), PEAK])

    def noisy(recipe: Recipe, device: str, evaluate: bool) -> Record:
        return fake_record(recipe.id, peak_allocated_bytes=next(peaks))

    store = BaselineStore(tmp_path)
    tolerances = calibrate("vit-smoke/bf16-true", 3, store, run_fn=noisy)
    assert abs(tolerances["peak_allocated_bytes"] - 3 * 0.02 / (1.02 / 3 + 2 / 3)) < 1e-3
    assert tolerances["param_bytes"] == 0.005  # no spread: the floor
    stored = store.load("cpu-x86_64", fresh=True)["vit-smoke/bf16-true"]
    # Only what differs from the defaults is stored: the one metric that spread.
    assert stored.tolerances == {"peak_allocated_bytes": tolerances["peak_allocated_bytes"]}
