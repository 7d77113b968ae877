"""``memclaims reproduce``: the article's chain on this machine, beside the published numbers.

Absolute numbers are not comparable across scales (smoke on the CPU counts live tensor bytes; the
article printed CUDA reserved memory at full scale), so every row also carries its ratio to the
fp32 Fabric reference (01-2): ratios are what a claim asserts, and those can be compared.
Also ``calibrate``: tolerances from the spread of repeated runs, with a floor.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from memclaims.baselines import Baseline, BaselineStore, environment_id
from memclaims.compare import ACCURACY, MEMORY_METRICS, MIB, default_tolerances
from memclaims.recipe import Recipe, parse_id, resolve
from memclaims.record import Record

RunFn = Callable[[Recipe, str, bool], Record]  # (recipe, device, evaluate) -> Record

# (row, script, techniques, published GB, metric); "load" rows read the load phase only.
ROWS: tuple[tuple[str, str, tuple[str, ...], float, str], ...] = (
    ("01", "01_pytorch-vit", ("pytorch",), 26.79, "train"),
    ("01-2", "01-2_pytorch-fabric", ("fabric",), 26.84, "train"),
    ("02", "02_mixed-precision", ("16-mixed",), 18.21, "train"),
    ("03", "03_bfloat16", ("bf16-true",), 13.82, "train"),
    ("04", "04_lower-batchsize", ("bf16-true", "small-batch"), 5.69, "train"),
    ("05", "05_gradient-accum", ("bf16-true", "small-batch", "grad-accum"), 3.91, "train"),
    ("06", "06_sgd-with-scheduler", ("bf16-true", "small-batch", "grad-accum", "sgd"), 2.02, "train"),
    ("07-1", "07_01 load, fp32 then .to(float16)", ("16-true", "init-module"), 1.24, "reference-load"),
    ("07-3", "07_03 load inside init_module, 16-true", ("16-true", "init-module"), 0.65, "load"),
)
REFERENCE_ROW = "01-2"


@dataclass
class Row:
    row: str
    script: str
    recipe: str
    published_gb: float
    measured_bytes: int | None
    baseline_bytes: int | None
    published_ratio: float
    measured_ratio: float | None
    verdict: str


def _default_run(recipe: Recipe, device: str, evaluate: bool) -> Record:
    from memclaims.runner import RunOptions, run

    if device == "sim":
        from memclaims import sim

        return sim.simulate(recipe)

    return run(recipe, RunOptions(device=device, evaluate=evaluate))


def _measured(record: Record, kind: str, device: str) -> int | None:
    if kind == "load":
        return record.load_peak_bytes
    if kind == "reference-load":
        return record.reference_load_peak_bytes
    # The article's figure on CUDA (and its prediction on sim); exact live bytes on the CPU.
    return record.peak_reserved_total_bytes if device in ("cuda", "sim") else record.peak_allocated_bytes


def _verdict(row: str, prev: Row | None, measured_ratio: float | None, published_ratio: float) -> str:
    if measured_ratio is None or prev is None or prev.measured_ratio is None:
        return "n/a"
    if row in ("01", "01-2"):  # claim 1: Fabric changes nothing
        return "holds" if abs(measured_ratio - prev.measured_ratio) <= 0.05 * prev.measured_ratio else "does not hold"
    claimed_smaller = published_ratio < prev.published_ratio
    measured_smaller = measured_ratio < prev.measured_ratio
    return "holds" if claimed_smaller == measured_smaller else "does not hold"


def reproduce(device: str, out: Path, *, run_fn: RunFn | None = None, store: BaselineStore | None = None,
              scale: str | None = None) -> list[Row]:
    """Run the chain on ``device``; write reproduce.md, reproduce.json and reproduce.png under ``out``."""
    run_fn = run_fn or _default_run
    scale = scale or ("smoke" if device == "cpu" else "article")
    records: dict[tuple[str, ...], Record] = {}
    measured: dict[str, tuple[str, int | None, int | None]] = {}
    for row, _script, techniques, _gb, kind in ROWS:
        recipe = resolve("vit", scale, techniques)
        if techniques not in records:
            records[techniques] = run_fn(recipe, device, kind == "train")
        record = records[techniques]
        baseline = store.get(environment_id(record), recipe.id) if store else None
        measured[row] = (recipe.id, _measured(record, kind, device),
                         _measured(baseline.record, kind, device) if baseline else None)
    ref = measured[REFERENCE_ROW][1]
    ref_gb = next(gb for r, _s, _t, gb, _k in ROWS if r == REFERENCE_ROW)
    # What each row's claim compares it with: the chain is cumulative, 01 and 01-2 are parity,
    # and the init_module load (07-3) is judged against the fp32-then-convert load (07-1).
    versus = {"01": "01-2", "01-2": "01", "02": "01-2", "03": "02", "04": "03", "05": "04", "06": "05",
              "07-3": "07-1"}
    rows: dict[str, Row] = {}
    for row, script, _techniques, gb, _kind in ROWS:
        recipe_id, now, base = measured[row]
        rows[row] = Row(row, script, recipe_id, gb, now, base, gb / ref_gb,
                        now / ref if now is not None and ref else None, "n/a")
    for row, other in versus.items():
        r = rows[row]
        r.verdict = _verdict(row, rows[other], r.measured_ratio, r.published_ratio)
    result = list(rows.values())
    out.mkdir(parents=True, exist_ok=True)
    _write(result, device, scale, out)
    return result


def _unit(device: str) -> tuple[str, float]:
    if device == "cuda":
        return ("GB reserved (decimal)", 1e9)
    if device == "sim":
        return ("GB reserved (decimal), predicted", 1e9)
    return ("MiB live tensor bytes, smoke scale", MIB)


def _write(rows: list[Row], device: str, scale: str, out: Path) -> None:
    unit, div = _unit(device)
    fmt = lambda v: "" if v is None else f"{v / div:.2f}"  # noqa: E731
    lines = [f"# The article's chain on {device} ({scale} scale)", "",
             f"Published: CUDA peak reserved memory, decimal GB, ViT-L/16 at article scale. "
             f"Measured here: {unit}. Compare the ratios (to 01-2, the fp32 Fabric reference), not the "
             f"absolute numbers.", "",
             f"| row | published (GB) | measured here ({unit}) | baseline ({unit}) | published ratio | "
             f"measured ratio | claim |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "" if r.measured_ratio is None else f"{r.measured_ratio:.3f}"
        lines.append(f"| {r.row} {r.script} | {r.published_gb:.2f} | {fmt(r.measured_bytes)} | "
                     f"{fmt(r.baseline_bytes)} | {r.published_ratio:.3f} | {ratio} | {r.verdict} |")
    (out / "reproduce.md").write_text("\n".join(lines) + "\n")
    (out / "reproduce.json").write_text(json.dumps(
        {"device": device, "scale": scale, "measured_unit": unit, "published_unit": "GB reserved (decimal)",
         "rows": [asdict(r) for r in rows]}, indent=2, sort_keys=True) + "\n")
    _plot(rows, device, scale, unit, div, out / "reproduce.png")


def _plot(rows: list[Row], device: str, scale: str, unit: str, div: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on CI runners
    import matplotlib.pyplot as plt

    labels = [r.row for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.bar(labels, [r.published_gb for r in rows], color="tab:gray")
    left.set_ylabel("peak reserved memory (GB, decimal)")
    left.set_title("published (article scale, CUDA)")
    right.bar(labels, [0 if r.measured_bytes is None else r.measured_bytes / div for r in rows], color="tab:blue")
    right.set_ylabel(f"peak memory ({unit})")
    right.set_title(f"measured here ({device}, {scale} scale)")
    for axis in (left, right):
        axis.set_xlabel("article row")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def calibrate(recipe_id: str, runs: int, store: BaselineStore, *, device: str = "cpu",
              run_fn: RunFn | None = None, factor: float = 3.0) -> dict[str, float | None]:
    """Run a recipe ``runs`` times; tolerance = max(floor, factor x relative spread), stored with its baseline.

    The floor is the tier's default tolerance: a deterministic tier must not get a zero tolerance.
    """
    run_fn = run_fn or _default_run
    recipe = parse_id(recipe_id)
    records = [run_fn(recipe, device, True) for _ in range(runs)]
    floors = default_tolerances(records[0].device)
    tolerances: dict[str, float | None] = dict(floors)
    for metric in MEMORY_METRICS:
        values = [getattr(r, metric) for r in records if getattr(r, metric) is not None]
        if values and statistics.mean(values) > 0:
            spread = (max(values) - min(values)) / statistics.mean(values)
            tolerances[metric] = max(floors[metric] or 0.0, factor * spread)
    accuracies = [r.accuracy for r in records if r.accuracy is not None]
    if accuracies:
        tolerances[ACCURACY] = max(floors[ACCURACY] or 0.0, factor * (max(accuracies) - min(accuracies)))
    environment = environment_id(records[0])
    existing = store.load(environment, fresh=True).get(recipe.id)
    record = existing.record if existing else records[0]
    store.update(environment, {recipe.id: Baseline(record=record, tolerances=tolerances)})
    return tolerances
