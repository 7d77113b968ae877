"""``memclaims reproduce`` on constructed runs (no training)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fixtures.claim_worlds import fake_run
from memclaims.baselines.store import BaselineStore
from memclaims.core.record import Record
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import Recipe
from memclaims.report.reproduce import reproduce
from memclaims.report.series import MeasureFn


def test_reproduce_writes_markdown_json_and_chart(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    from memclaims.recipes.recipe import resolve

    store.store_record(fake_run(resolve("vit", "smoke", ("fabric",)), "cpu", True))
    rows = reproduce("cpu", tmp_path / "out", run_fn=fake_run, store=store)
    assert [r.row for r in rows] == ["01", "01-2", "02", "03", "04", "05", "06", "07-1", "07-3"]
    assert [r.kind for r in rows] == ["train"] * 7 + ["load"] * 2
    assert all(r.verdict == "holds" for r in rows if r.claim), [(r.row, r.size) for r in rows]
    assert rows[2].ran_as.startswith("bf16-mixed (asked 16-mixed")
    md = (tmp_path / "out" / "reproduce.md").read_text()
    assert "| 02 02_mixed-precision | 16-mixed | bf16-mixed (asked 16-mixed" in md
    assert "| 04 04_lower-batchsize | + small-batch | as asked | 5.69 |" in md
    assert "## Model loading (07)" in md and "| 07-3 07_03 load (init_module, 16-true) | init-module | 0.65 |" in md
    assert "holds: within band" in md
    assert "text 20x, logs 26.84 / 2.02 = 13.3x, this run" in md
    assert "text 50 %, logs 1 - 0.65 / 1.24 = 47.6 %, this run 50.0%" in md
    data = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert data["published_unit"] == "GB reserved (decimal)" and data["rows"][1]["measured_ratio"] == 1.0
    assert data["rows"][1]["baseline_bytes"] == data["rows"][1]["measured_bytes"]
    assert data["sim_profile"] is None and "Predicted on the sim" not in md  # a real device: no profile to state
    assert (tmp_path / "out" / "reproduce.png").read_bytes()[:4] == b"\x89PNG"


def test_reproduces_verdicts_reach_what_memclaims_claims_shows(tmp_path: Path) -> None:
    from memclaims.claims import catalogue
    from memclaims.claims import runs as claim_runs

    last_run = tmp_path / "memclaims-results" / claim_runs.LAST_RUN_NAME
    rows = reproduce("cpu", tmp_path / "out", run_fn=fake_run, last_run=last_run)
    judged = {r.claim: r.verdict for r in rows if r.claim}
    shown = {row["claim"]: row["tiers"]["cpu"]["verdict"] for row in catalogue.table(claim_runs.read(last_run))
             if "verdict" in row["tiers"].get("cpu", {})}  # the claims the catalogue checks on the cpu tier
    checked = {claim: verdict for claim, verdict in judged.items() if claim in shown}
    assert len(checked) >= 3 and all(shown[claim] == verdict for claim, verdict in checked.items()), (judged, shown)


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


def test_reproduce_on_the_sim_compares_with_published_ratios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import memclaims.run
    import memclaims.sim.timemodel as timemodel
    from fixtures.claim_worlds import fake_load

    era = "article+bitsandbytes=0.39.0-0.43.1"  # --era bitsandbytes=0.41 (issue #53): replayed, and said
    asked: list[tuple[str, bool]] = []
    replayed: list[str] = []  # the recipes replayed in full (training steps)

    def door(recipe: Recipe, options: Any) -> list[Record]:  # the published world, at the one door
        asked.append((options.profile, options.load_only))
        replayed.extend([] if options.load_only else [recipe.id])
        return [fake_load()(recipe, options.device) if options.load_only else fake_run(recipe, options.device, False)]

    monkeypatch.setattr(timemodel, "predicted_ratio", lambda candidate, reference: 1 / 6.1)
    monkeypatch.setattr(memclaims.run, "run_recipe", door)
    rows = {r.row: r for r in reproduce("sim", tmp_path, profile=era)}
    assert set(asked) == {(era, False), (era, True)}  # the chain's runs and the 07 load replays
    # The 07 rows read the load-only replays: the init-module recipe is not replayed in full too (issue #53's seconds).
    assert "vit-article/16-true+init-module" not in replayed and len(replayed) == len(set(replayed)) == 7, replayed
    assert all(r.verdict == "holds" for r in rows.values() if r.claim), {k: r.size for k, r in rows.items()}
    assert "published 0.412" in rows["04"].size  # 5.69 / 13.82
    assert rows["07-3"].measured_ratio == rows["07-3"].published_ratio  # the load replay's reserved peaks
    md = (tmp_path / "reproduce.md").read_text()
    assert "text 6x faster, logs 17.88 / 3.45 = 5.2x, this run (roofline on the simulated A100" in md
    assert "GB reserved (decimal), predicted" in md and "| 02 02_mixed-precision | 16-mixed | as asked | 18.21 |" in md
    assert f"\nPredicted on the sim, profile {era!r} (" in md and ", bitsandbytes 0.39.0-0.43.1, peft " in md
    assert json.loads((tmp_path / "reproduce.json").read_text())["sim_profile"] == era


# --- the ViT-H/14 series and the LLM bonus rows (reproduce --all on cpu and cuda) --------------------

STATE = 1_000  # parameters, gradients and optimizer state of a one-process bar, each
# Peak of each bar, as a fraction of the one-process bar of its series (memclaims.report.series' floors:
# FSDP over 2 ranks >= 0.5; checkpointing >= the sharded state / the FSDP peak; the bonus "after"
# >= 0.119 of its "before").
HOLDING = {("16-mixed",): 1.0, ("16-mixed", "fsdp"): 0.7, ("16-mixed", "fsdp", "activation-checkpointing"): 0.5,
           ("16-mixed", "fsdp", "activation-checkpointing", "cpu-offload"): 0.4, ("fabric",): 1.0, ("ddp",): 1.0, ("16-mixed", "deepspeed-zero2"): 1.0,
           ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init"): 0.2,
           ("bf16-true", "grad-accum", "fsdp", "delayed-init"): 0.2}


def fake_measure(peaks: dict[tuple[str, ...], float], devices: int = 2,
                 calls: list[list[str]] | None = None) -> MeasureFn:
    def measure(recipes: Sequence[Recipe], device: str) -> list[list[Record]]:
        if calls is not None:
            calls.append([r.id for r in recipes])
        result = []
        for recipe in recipes:
            strategy = recipe.distributed
            ranks = devices if strategy is not None and strategy.shards_parameters else 1
            state = STATE // ranks
            result.append([fake_record(
                recipe.id, workload=recipe.workload, techniques=list(recipe.techniques), device=device,
                precision=recipe.precision, batch_size=recipe.batch_size, accumulation_steps=recipe.accumulation_steps,
                param_bytes=state, grad_bytes=state, optimizer_state_bytes=state, devices=ranks, rank=rank,
                peak_allocated_bytes=int(10_000 * peaks[recipe.techniques]),
                peak_reserved_total_bytes=int(10_000 * peaks[recipe.techniques])) for rank in range(ranks)])
        return result

    return measure


def _gb(named: str) -> float:
    from memclaims.recipes.named import NAMED_RECIPES

    value = NAMED_RECIPES[named].published.peak_gb
    assert value is not None
    return value


def test_reproduce_all_adds_the_series_with_their_own_reference(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    rows = reproduce("cpu", tmp_path, run_fn=fake_run, series=True, measure_fn=fake_measure(HOLDING, calls=calls))
    series = {r.row: r for r in rows if r.kind == "series"}
    assert list(series) == ["vit-h14/one-gpu", "vit-h14/fsdp", "vit-h14/fsdp-checkpointing",
                            "vit-h14/fsdp-checkpointing-offload", "distilbert/before", "distilbert/after",
                            "bigbird/before", "bigbird/after"]
    # One measurement of every bar that runs on the CPU: offload there is the bar before's run, not run.
    assert calls == [["vit-h14-smoke/16-mixed", "vit-h14-smoke/16-mixed+fsdp",
                      "vit-h14-smoke/16-mixed+fsdp+activation-checkpointing", "distilbert-smoke/16-mixed",
                      "distilbert-smoke/bf16-true+grad-accum+fsdp+delayed-init", "bigbird-smoke/ddp",
                      "bigbird-smoke/bf16-true+grad-accum+fsdp+delayed-init"]]
    h14 = [_gb(n) for n in ("vit-h14-one-gpu", "vit-h14-fsdp", "vit-h14-fsdp-checkpointing-offload")]
    assert series["vit-h14/fsdp"].published_ratio == h14[1] / h14[0]
    assert series["vit-h14/fsdp"].measured_ratio == 0.7 and series["vit-h14/fsdp-checkpointing"].measured_ratio == 0.5
    assert [series[k].verdict for k in series] == ["n/a", "holds", "holds", "n/a", "n/a", "holds", "n/a", "holds"]
    offload = series["vit-h14/fsdp-checkpointing-offload"]
    assert offload.measured_bytes is None and offload.measured_ratio is None and "needs --device cuda" in offload.size
    assert offload.published_ratio == h14[2] / h14[0]
    assert series["bigbird/before"].published_gb is None and series["bigbird/after"].published_ratio is None
    assert "band [0.500, 1)" in series["vit-h14/fsdp"].size, series["vit-h14/fsdp"].size
    assert "CPU ranks (gloo) instead of 4 GPUs" in series["vit-h14/fsdp"].ran_as
    assert "bf16-mixed for 16-mixed" in series["vit-h14/one-gpu"].ran_as
    assert "without DeepSpeed ZeRO-2 on one process" in series["distilbert/before"].ran_as
    assert "find_unused_parameters=True" in series["bigbird/before"].ran_as  # BigBird runs DDP on CPU ranks
    assert "no CPU offload" in series["distilbert/after"].ran_as and "smoke scale" in series["bigbird/after"].ran_as
    md = (tmp_path / "reproduce.md").read_text()
    assert "## Series vit-h14: ViT-H/14 at 518 px" in md and "## Series distilbert:" in md
    after, before = _gb("distilbert-after"), _gb("distilbert-before")
    assert f"| {after:.2f} | 0.00 | {after / before:.3f} | 0.200 | holds: within band |" in md
    assert "| bigbird/before | bonus_bigbird-before | ddp | " in md and "| did not run | 0.01 | n/a | 1.000 |" in md
    assert f"| {h14[2]:.2f} | not run | {h14[2] / h14[0]:.3f} | n/a | n/a: CPU offload moves parameters off a GPU |" in md
    data = json.loads((tmp_path / "reproduce.json").read_text())
    assert [s["reference"] for s in data["series"]] == ["vit-h14/one-gpu", "distilbert/before", "bigbird/before"]
    assert sum(r["kind"] == "series" for r in data["rows"]) == 8
    assert (tmp_path / "reproduce.png").read_bytes()[:4] == b"\x89PNG"


def test_reproduce_all_says_when_a_series_bar_does_not_hold(tmp_path: Path) -> None:
    broken = {**HOLDING, ("16-mixed", "fsdp"): 1.05, ("16-mixed", "fsdp", "activation-checkpointing"): 0.05,
              ("bf16-true", "grad-accum", "fsdp", "delayed-init"): 0.05}
    series = {r.row: r for r in reproduce("cpu", tmp_path, run_fn=fake_run, series=True,
                                          measure_fn=fake_measure(broken)) if r.kind == "series"}
    assert series["vit-h14/fsdp"].verdict == "does not hold"
    assert "outside, +0.050 above the bar before" in series["vit-h14/fsdp"].size
    # Checkpointing cannot remove more than every activation: 0.05 / 1.05 is below the sharded state's share.
    assert series["vit-h14/fsdp-checkpointing"].verdict == "does not hold"
    assert "below the floor" in series["vit-h14/fsdp-checkpointing"].size
    # Both "after" recipes (the same techniques) at 0.05 of their "before": below the floor of 0.119.
    assert {series[k].verdict for k in ("distilbert/after", "bigbird/after")} == {"does not hold"}
    assert "0.069 below the floor" in series["distilbert/after"].size, series["distilbert/after"].size
    md = (tmp_path / "reproduce.md").read_text()
    assert "does not hold: outside, +0.050 above the bar before" in md


def test_reproduce_all_on_one_gpu_runs_offload_and_says_fsdp_needs_two(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    measure = fake_measure(HOLDING, devices=1, calls=calls)

    def bigbird_before_does_not_fit(recipes: Sequence[Recipe], device: str) -> list[list[Record]]:
        return [[] if r.id == "bigbird-article/ddp" else ranks for r, ranks in zip(recipes, measure(recipes, device))]

    series = {r.row: r for r in reproduce("cuda", tmp_path, run_fn=fake_run, series=True,
                                          measure_fn=bigbird_before_does_not_fit) if r.kind == "series"}
    assert "vit-h14-article/16-mixed+fsdp+activation-checkpointing+cpu-offload" in calls[0]
    assert series["vit-h14/fsdp"].verdict == "n/a" and "needs 2 devices" in series["vit-h14/fsdp"].size
    assert series["vit-h14/fsdp-checkpointing-offload"].verdict == "holds"
    assert "every GPU of this machine instead of 4" in series["distilbert/after"].ran_as
    assert "smoke scale" not in series["distilbert/after"].ran_as
    # bonus_bigbird-before out of memory, as the article found: no ratio for its "after".
    assert series["bigbird/before"].measured_bytes is None and series["bigbird/before"].size == "out of memory on this device"
    assert series["bigbird/after"].verdict == "n/a" and series["bigbird/after"].measured_ratio is None
    assert "| did not run | not run | n/a | n/a | n/a: out of memory on this device |" in (tmp_path / "reproduce.md").read_text()


def test_cli_all_adds_the_series_on_cpu_and_the_published_table_on_the_sim(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import memclaims.report.reproduce as report
    from memclaims.cli import main
    from memclaims.report import published_table

    asked: list[tuple[str, bool]] = []

    def fake_reproduce(device: str, out: Path, **kwargs: Any) -> list[report.Row]:
        asked.append((device, kwargs["series"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / "reproduce.md").write_text("chain\n")
        return []

    monkeypatch.setattr(report, "reproduce", fake_reproduce)
    monkeypatch.setattr(published_table, "build_table", lambda: [])
    assert main(["reproduce", "--out", str(tmp_path)]) == 0
    assert main(["reproduce", "--all", "--out", str(tmp_path)]) == 0
    assert asked == [("cpu", False), ("cpu", True)]
    assert main(["reproduce", "--device", "sim", "--all", "--out", str(tmp_path)]) == 0
    assert asked == [("cpu", False), ("cpu", True)] and (tmp_path / "reproduce-all.md").is_file()


def test_fidelity_hf_rows_read_the_live_bytes_of_the_phases_that_have_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-device sim Record's step phases (forward, backward...) carry no live_bytes: load and train do."""
    import memclaims.run
    from memclaims.report import fidelity

    def fake_measure(recipe: Recipe, options: Any) -> list[Record]:
        if options.device == "cpu":
            return [fake_record(recipe.id, peak_allocated_bytes=1000)]
        phases = {"load": {"allocated_bytes": 10, "live_bytes": 8}, "train": {"allocated_bytes": 990, "live_bytes": 900},
                  "forward": {"allocated_bytes": 990}}
        return [fake_record(recipe.id, device="sim", phases=phases)]

    monkeypatch.setattr(memclaims.run, "run_recipe", fake_measure)
    monkeypatch.setattr(fidelity, "HF_MODELS", (("hf:gpt2", ("bf16-true",)),))
    (row,) = fidelity.hf_rows(None)
    assert (row.reference_bytes, row.predicted_bytes) == (1000, 900)
    assert row.profile == "cpu-kernels"


def test_fidelity_article_rows_replay_the_profile_asked_and_say_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """--era (issue #53) reaches every article row's replay through its profile's name, which each row, its JSON
    and the table state."""
    import memclaims.run
    from memclaims.report import fidelity

    era = "article+bitsandbytes=0.39.0-0.43.1"
    asked: list[str] = []

    def fake_predict(recipe: Recipe, options: Any) -> list[Record]:
        asked.append(options.profile)
        return [fake_record(recipe.id, device="sim", peak_reserved_total_bytes=10**9, peak_reserved_bytes=10**9)]

    monkeypatch.setattr(memclaims.run, "run_recipe", fake_predict)
    rows = fidelity.article_rows(era, None)
    assert len(rows) > 2 and set(asked) == {era} and len(asked) == len(rows)
    assert {row.as_dict()["profile"] for row in rows} == {era}
    assert f"Predicted on sim profile {era!r}: {rows[0].row}, " in "\n".join(fidelity.table(rows))
