"""``memclaims reproduce`` and ``baselines calibrate`` on fake runs (no training)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from memclaims.baselines import BaselineStore
from memclaims.recipe import Recipe, resolve
from memclaims.record import Record
from memclaims.report import calibrate, reproduce
from suite.selftest.test_baselines import PEAK, fake_record

# Fake peaks shaped like the article's chain: each row smaller than the one before.
SHAPE = {("pytorch",): 1.0, ("fabric",): 1.0, ("16-mixed",): 0.7, ("bf16-true",): 0.5,
         ("bf16-true", "small-batch"): 0.3, ("bf16-true", "small-batch", "grad-accum"): 0.2,
         ("bf16-true", "small-batch", "grad-accum", "sgd"): 0.1, ("16-true", "init-module"): 0.05}


def fake_run(recipe: Recipe, device: str, evaluate: bool) -> Record:
    peak = int(PEAK * SHAPE[recipe.techniques])
    return fake_record(recipe.id, peak_allocated_bytes=peak, load_peak_bytes=peak // 2,
                       reference_load_peak_bytes=peak, techniques=list(recipe.techniques))


def test_reproduce_writes_markdown_json_and_chart(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    store.store_record(fake_run(resolve("vit", "smoke", ("fabric",)), "cpu", True))
    rows = reproduce("cpu", tmp_path / "out", run_fn=fake_run, store=store)
    assert [r.row for r in rows] == ["01", "01-2", "02", "03", "04", "05", "06", "07-1", "07-3"]
    assert all(r.verdict == "holds" for r in rows if r.row != "07-1"), rows
    md = (tmp_path / "out" / "reproduce.md").read_text()
    assert "MiB live tensor bytes, smoke scale" in md and "| 01-2 01-2_pytorch-fabric | 26.84 | 10.00 | 10.00 | 1.000 | 1.000 | holds |" in md
    data = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert data["rows"][6]["measured_ratio"] == 0.1 and data["published_unit"] == "GB reserved (decimal)"
    assert (tmp_path / "out" / "reproduce.png").read_bytes()[:4] == b"\x89PNG"


def test_calibrate_stores_spread_with_a_floor(tmp_path: Path) -> None:
    peaks = itertools.cycle([PEAK, int(PEAK * 1.02), PEAK])

    def noisy(recipe: Recipe, device: str, evaluate: bool) -> Record:
        return fake_record(recipe.id, peak_allocated_bytes=next(peaks))

    store = BaselineStore(tmp_path)
    tolerances = calibrate("vit-smoke/bf16-true", 3, store, run_fn=noisy)
    assert abs(tolerances["peak_allocated_bytes"] - 3 * 0.02 / (1.02 / 3 + 2 / 3)) < 1e-3
    assert tolerances["param_bytes"] == 0.005  # no spread: the floor
    stored = store.load("cpu-x86_64", fresh=True)["vit-smoke/bf16-true"]
    assert stored.tolerances == tolerances
