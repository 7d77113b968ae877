"""``memclaims reproduce``: the article's chain on this machine, beside the published numbers.

Absolute numbers are not comparable across scales (smoke on the CPU counts live tensor bytes; the
article printed CUDA reserved memory at full scale), so every row also carries its ratio to the
fp32 Fabric reference (01-2): ratios are what a claim asserts, and those can be compared.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memclaims.baselines.compare import MIB
from memclaims.baselines.store import BaselineStore
from memclaims.core import progress, published
from memclaims.core.environment import environment_id
from memclaims.core.errors import OutOfMemory, UsageError
from memclaims.core.names import ARTICLE_PROFILE, device_tier
from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.report.calibration import RunFn, run_once
from memclaims.report.series import MeasureFn
from memclaims.techniques import technique_registry as registry

if TYPE_CHECKING:
    from memclaims.claims.catalogue import Claim
    from memclaims.claims.check import Check
    from memclaims.claims.lookup import Lookup

LoadFn = Callable[[Recipe, str], Record]  # (recipe, device) -> the Record of its load only (the sim's 07 replay)

# (row, published script, techniques, the claim that judges the row's size against the row before).
# Row 01 (plain PyTorch) and the chain (techniques.technique_registry.CHAIN, 01-2 -> 06); each row's script is its
# logged row in published.json; the claim judges row 01 against 01-2 and every later row against the one before.
_ROW_CLAIMS = ("fabric-memory", None, "16-mixed-memory", "bf16-true-memory", "small-batch-memory",
               "grad-accum-memory", "sgd-memory")
CHAIN_ROWS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = tuple(
    (script.split("_")[0], script, techniques, claim)
    for techniques, claim in zip((("pytorch",), *registry.CHAIN), _ROW_CLAIMS, strict=True)
    for script in [str(published.chain_row(techniques)["script"])])
REFERENCE_ROW = "01-2"
REFERENCE_SCRIPT = CHAIN_ROWS[1][1]
LOAD_RECIPE = ("16-true", "init-module")
# The model-loading scripts (07): (row, published script, which load of the init-module recipe).
LOAD_ROWS = (("07-1", "07_01", "reference-load"), ("07-3", "07_03", "load"))
# Claims whose verdicts the report quotes below the tables (the whole chain, the load, time).
SUMMARY_CLAIMS = ("overall-20x", "init-module-load")


@dataclass
class Row:
    row: str
    script: str
    recipe: str
    technique: str  # what the row adds, in the registry's words
    published_gb: float | None  # None: the published run did not run (bonus_bigbird-before)
    measured_bytes: int | None
    baseline_bytes: int | None
    published_ratio: float | None
    measured_ratio: float | None
    verdict: str  # "holds" / "does not hold" / "n/a": the size claim of this row
    size: str = ""  # the claim's detail: ratio against the row before, expected, band, within or outside
    ran_as: str = ""  # a substitution, e.g. "bf16-mixed (Lightning has no float16 AMP on the CPU)"
    kind: str = "train"  # "train", "load" (07: a load peak, its own unit and reference) or "series"
    claim: str = ""
    series: str = ""  # for kind "series": vit-h14, distilbert or bigbird (memclaims.report.series), ratios to its first bar
    # The environment (CPU class, GPU) whose baseline the row's baseline column holds: this machine's, or the
    # sibling class pytest falls back to too (BaselineStore.find); "" where no baseline was found.
    baseline_environment: str = ""


def _runs_on(profile: str) -> RunFn:
    """One run of a one-device recipe through the one door, on the sim's ``profile`` where the device is the sim."""
    def run(recipe: Recipe, device: str, evaluate: bool) -> Record:
        from memclaims.recipes.run_options import RunOptions
        from memclaims.run import run_recipe

        return run_recipe(recipe, RunOptions(device=device, evaluate=evaluate, profile=profile))[0]

    return run


def _loads_on(profile: str) -> LoadFn:
    """The sim's load-only replay of a recipe, on ``profile``."""
    def load(recipe: Recipe, device: str) -> Record:
        from memclaims.recipes.run_options import RunOptions
        from memclaims.run import run_recipe

        return run_recipe(recipe, RunOptions(device=device, load_only=True, profile=profile))[0]

    return load


def _train_bytes(record: Record, device: str) -> int | None:
    # The article's figure on CUDA (and its prediction on sim); exact live bytes on the CPU.
    return record.peak_reserved_total_bytes if device in ("cuda", "sim") else record.peak_allocated_bytes


def _load_bytes(record: Record | None, which: str) -> int | None:
    if record is None:
        return None
    return record.reference_load_peak_bytes if which == "reference-load" else record.load_peak_bytes


def _ran_as(recipe: Recipe, record: Record) -> str:
    if record.precision != recipe.precision:
        return f"{record.precision} (asked {recipe.precision}: Lightning has no float16 AMP on the {record.device})"
    return ""


def _label(techniques: tuple[str, ...], previous: tuple[str, ...] | None) -> str:
    """What the row adds to the row before ("+ small-batch"), or its techniques."""
    added = [t for t in techniques if t not in (previous or ())]
    return ("+ " if previous and len(added) < len(techniques) else "") + "+".join(added or techniques)


def _default_measure(recipes: Sequence[Recipe], device: str) -> list[list[Record]]:
    """The series' one dispatch: single-process recipes one by one, sharded ones in one process group
    (starting ranks costs seconds); memory only. One list of Records per recipe, rank 0 first."""
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipes

    sharded = [r for r in recipes if r.distributed]
    ranks = dict(zip([r.id for r in sharded], run_recipes(sharded, RunOptions(device=device, evaluate=False))))

    def single(recipe: Recipe) -> list[Record]:
        try:
            return [run_once(recipe, device, False)]
        except OutOfMemory:  # bonus_bigbird-before on a GPU: the article's "not possible"
            return []

    return [ranks[r.id] if r.distributed else single(r) for r in recipes]


def reproduce(device: str, out: Path, *, run_fn: RunFn | None = None, store: BaselineStore | None = None,
              scale: str | None = None, series: bool = False, measure_fn: MeasureFn | None = None,
              load_fn: LoadFn | None = None, last_run: Path | None = None, profile: str | None = None) -> list[Row]:
    """Run the chain on ``device`` (with ``series``: also the ViT-H/14 series and the LLM bonus rows,
    memclaims.report.series); write reproduce.md, reproduce.json and reproduce.png under ``out``.
    ``load_fn``: the sim's load-only replays of the 07 scripts (through memclaims.run.run_recipe unless given).
    ``last_run``: the claims' last-verdict file (memclaims.claims.runs) to add this run's verdicts to, which
    ``memclaims claims`` shows. ``profile``: the sim's (default: the article's; with an era, ``--era``: its name
    says it, ``memclaims.core.library_eras``), which the report states; ignored on a real device."""
    from memclaims.claims import catalogue as claims
    from memclaims.claims.lookup import Key, Lookup, recipe_of
    from memclaims.claims.sources import article
    from memclaims.run import model_parameters

    profile = (profile or ARTICLE_PROFILE) if device == "sim" else None
    run_fn = run_fn or (_runs_on(profile) if profile else run_once)
    scale = scale or ("smoke" if device == "cpu" else "article")
    records: dict[Key, Record] = {}
    recipes: dict[tuple[str, ...], Recipe] = {}
    baselines: dict[tuple[str, ...], Record | None] = {}
    read_from: dict[tuple[str, ...], str] = {}
    # On the sim the 07 rows read the load-only replays below, never the init-module recipe's own run: it is not
    # replayed in full (its load again and two training steps that nothing reads: 3 of reproduce's 26 CPU s).
    chain = [r[2] for r in CHAIN_ROWS] + ([] if device == "sim" else [LOAD_RECIPE])
    for techniques in progress.steps(chain, f"reproduce on {device}"):
        recipe = resolve("vit", scale, techniques)
        recipes[techniques] = recipe
        records[techniques] = run_fn(recipe, device, techniques != LOAD_RECIPE)
        # pytest's lookup: this machine's class, else the closest sibling class (one function for both)
        found = store.find(records[techniques]) if store else None
        baselines[techniques] = found[0].record if found else None
        read_from[techniques] = found[1] if found else ""
    if device == "sim":
        # The 07 scripts printed reserved memory of the stock 1000-class model: the sim's load-only
        # replays predict exactly that (the recipe's Record holds live bytes of the 10-class model).
        for load in (article.LOAD_BUILD_THEN_CONVERT, article.LOAD_INIT_MODULE):
            records[load] = (load_fn or _loads_on(profile or ARTICLE_PROFILE))(recipe_of(load, "vit", scale), device)
        # The init-module recipe's Record is its load-only replay (the init-module claim reads its scale there).
        recipes[LOAD_RECIPE] = resolve("vit", scale, LOAD_RECIPE)
        records[LOAD_RECIPE], baselines[LOAD_RECIPE], read_from[LOAD_RECIPE] = records[article.LOAD_INIT_MODULE], None, ""

    def find(key: Key) -> Record:
        if key == ("bf16-mixed",) and ("bf16-mixed",) not in records:
            return records[("16-mixed",)]  # what 16-mixed ran as on the CPU
        return records[key]

    lookup = Lookup(find, model_parameters)
    tier = device_tier(device)
    reference = _train_bytes(records[("fabric",)], device)
    reference_gb = published.row("vit_chain", REFERENCE_SCRIPT)["peak_reserved_gb"]
    rows: list[Row] = []
    previous: tuple[str, ...] | None = None
    for row, script, techniques, claim_name in CHAIN_ROWS:
        record = records[techniques]
        gb = published.row("vit_chain", script)["peak_reserved_gb"]
        measured = _train_bytes(record, device)
        base = baselines[techniques]
        verdict, size = "n/a", ""
        if claim_name:
            result = _check(claims.CLAIMS_BY_NAME[claim_name]).run(tier, lookup)
            verdict, size = ("holds" if result.passed else "does not hold"), result.detail
        rows.append(Row(row, script, recipes[techniques].id, _label(techniques, previous), gb, measured,
                        _train_bytes(base, device) if base else None, gb / reference_gb,
                        measured / reference if measured is not None and reference else None, verdict, size,
                        _ran_as(recipes[techniques], record), "train", claim_name or "",
                        baseline_environment=read_from[techniques]))
        previous = techniques if row != "01" else None
    load_record, load_base = records[LOAD_RECIPE], baselines[LOAD_RECIPE]
    load_reference_gb = published.row("model_loading", "07_01")["load_peak_reserved_gb"]
    load_result = _check(claims.CLAIMS_BY_NAME["init-module-load"]).run(tier, lookup)
    loads = {which: _load_bytes(load_record, which) for _, _, which in LOAD_ROWS}
    if device == "sim":  # the load-only replays' reserved peaks (above)
        loads = {"reference-load": records[article.LOAD_BUILD_THEN_CONVERT].peak_reserved_bytes,
                 "load": records[article.LOAD_INIT_MODULE].peak_reserved_bytes}
        load_base = None
    build = loads["reference-load"]
    for row, script, which in LOAD_ROWS:
        gb = published.row("model_loading", script)["load_peak_reserved_gb"]
        measured = loads[which]
        is_init = which == "load"
        rows.append(Row(row, f"{script} load ({'init_module, 16-true' if is_init else 'fp32, then .to(float16)'})",
                        recipes[LOAD_RECIPE].id, "init-module" if is_init else "build then convert", gb, measured,
                        _load_bytes(load_base, which), gb / load_reference_gb,
                        measured / build if measured is not None and build else None,
                        ("holds" if load_result.passed else "does not hold") if is_init else "n/a",
                        load_result.detail if is_init else "", "", "load", "init-module-load" if is_init else "",
                        baseline_environment=read_from[LOAD_RECIPE] if load_base else ""))
    if series:
        rows += _series_rows(device, scale, measure_fn or _default_measure)
    summary = _audit(tier, lookup)
    out.mkdir(parents=True, exist_ok=True)
    _write(rows, device, scale, out, summary, environment_id(records[("fabric",)]), profile)
    if last_run is not None:
        asked = f" (sim profile {profile!r})" if profile and profile != ARTICLE_PROFILE else ""
        record_verdicts(rows, tier, last_run, f"memclaims reproduce --device {device}{asked}")
    return rows


def _check(claim: Claim) -> Check:
    """The claim's check (every claim of the article's chain has one: the catalogue's coverage rule holds it)."""
    if claim.check is None:
        raise ValueError(f"claim {claim.name!r} has no check to run")
    return claim.check


def record_verdicts(rows: Sequence[Row], tier: str, path: Path, command: str) -> None:
    """Each claim a row judged, as its last verdict on ``tier`` (the store pytest's claim recorder writes),
    so that ``memclaims claims`` does not say "not run" of a claim reproduce just said holds."""
    from memclaims.claims import runs as claim_runs

    at = claim_runs.now()
    entries = {claim_runs.key(r.claim, tier): {"verdict": r.verdict, "detail": r.size, "nodeid": command,
                                               "at": at, "session": at}
               for r in rows if r.claim and r.verdict in ("holds", "does not hold")}
    if entries:
        claim_runs.write(path, entries)


def baseline_sources(rows: list[Row], here: str) -> str:
    """Which class the baseline column was read from, in one line: this machine's, a sibling's, or none."""
    read = sorted({r.baseline_environment for r in rows if r.baseline_environment})
    if not read:
        return f"Baselines: none stored for this machine's class {here} or a sibling class."
    others = [e for e in read if e != here]
    if not others:
        return f"Baselines: this machine's class, {here}."
    return (f"Baselines: read from the sibling class {', '.join(others)} (this machine is {here}, which has "
            f"{'some' if here in read else 'none'} of them), as pytest falls back.")


def _series_rows(device: str, scale: str, measure_fn: MeasureFn) -> list[Row]:
    """One row per bar of every series (memclaims.report.series): ratios to the series' first bar."""
    from memclaims.report import series as series_module

    if device == "sim":
        raise UsageError("the series are predicted by `memclaims reproduce --device sim --all` (reproduce-all.md)")
    bars = series_module.plan(device, scale)
    recipes = series_module.recipes(bars, scale)
    measured = dict(zip(recipes, measure_fn(list(recipes.values()), device)))
    peak: Callable[[Record], int] = lambda r: _train_bytes(r, device) or 0  # noqa: E731
    rows: list[Row] = []
    for name, _title, names in series_module.SERIES:
        mine = [b for b in bars if b.series == name]
        first_ranks = measured.get(names[0])
        first = first_ranks[0] if first_ranks else None
        first_gb = mine[0].named.published.peak_gb
        before: Record | None = None
        before_gb: float | None = None
        for index, bar in enumerate(mine):
            ranks = measured.get(bar.named.name)
            record = ranks[0] if ranks else None
            gb = bar.named.published.peak_gb
            verdict, size = "n/a", bar.why_not or ("out of memory on this device" if ranks == [] else "")
            if index:
                result = series_module.step(before, record, peak, gb / before_gb if gb and before_gb else None)
                if result.passed is not None:
                    verdict = "holds" if result.passed else "does not hold"
                size = size or result.detail
            label = bar.named.name.removeprefix(f"{name}-")
            rows.append(Row(f"{name}/{label}", bar.named.source, recipes[bar.named.name].id if bar.named.name in recipes
                            else f"{bar.named.workload}-{scale}/{'+'.join(bar.named.techniques)}",
                            "+".join(bar.named.techniques), gb, None if record is None else peak(record), None,
                            gb / first_gb if gb is not None and first_gb else None,
                            peak(record) / peak(first) if record is not None and first is not None else None,
                            verdict, size, "; ".join(bar.substitutions), "series", bar.named.name, name))
            if record is not None:
                before, before_gb = record, gb
    return rows


def _audit(tier: str, lookup: Lookup) -> dict[str, str]:
    """Every claim whose text and logs disagree: 'text X, logs Y, this run Z' where this tier checks
    it with the records at hand, else why this run says nothing about it."""
    from memclaims.claims import catalogue as claims
    from memclaims.claims.figures import as_factor
    from memclaims.claims.sources import article

    result = {}
    for claim in claims.CLAIMS:
        if not claim.audit and claim.name not in SUMMARY_CLAIMS:
            continue
        said = f"text {claim.audit['text']}, logs {claim.audit['logs']}" if claim.audit else ""
        timed = next((t for t in article.TIME_RATIOS if t.claim == claim.name), None)
        if tier == "sim" and timed is not None and claim.checks.get("sim", "").startswith("suite/cases/test_sim_step_times"):
            from memclaims.sim.timemodel import predicted_ratio

            ratio = predicted_ratio(timed.candidate, timed.reference)
            result[claim.name] = (f"{said}, this run (roofline on the simulated A100, memclaims/sim/timemodel.py) "
                                  f"{as_factor(ratio)}{' faster' if ratio < 1 else ''}")
            continue
        if claim.check is not None and tier in claim.tiers:
            try:
                result[claim.name] = claim.check.run(tier, lookup).detail
                continue
            except KeyError:  # a recipe reproduce does not run (e.g. the time claims' pairs)
                pass
        why = claims.skip_reason(claim, tier) or "its recipes are not part of reproduce"
        result[claim.name] = f"{said}, this run: not measured ({why})"
    return result


def _unit(device: str) -> tuple[str, float]:
    if device == "cuda":
        return ("GB reserved (decimal)", 1e9)
    if device == "sim":
        return ("GB reserved (decimal), predicted", 1e9)
    return ("MiB live tensor bytes, smoke scale", MIB)


def _write(rows: list[Row], device: str, scale: str, out: Path, summary: dict[str, str], here: str,
           profile: str | None) -> None:
    from memclaims.claims import catalogue as claims

    unit, div = _unit(device)

    def fmt(value: int | None) -> str:
        return "" if value is None else f"{value / div:.2f}"

    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}"

    train = [r for r in rows if r.kind == "train"]
    load = [r for r in rows if r.kind == "load"]
    lines = [f"# The article's chain on {device} ({scale} scale)", "", *_predicted_on(profile),
             f"Published: CUDA peak reserved memory, decimal GB, ViT-L/16 at article scale. Measured here: {unit}. "
             f"Ratios are to 01-2, the fp32 Fabric reference. Size verdict: the row's claim, its ratio to the row "
             f"before against {'a ratio derived from exact parameter, gradient and state bytes' if device == 'cpu' else 'the published ratio'}, "
             "within a stated band.", "", baseline_sources(rows, here), "",
             f"| row | technique | ran as | published (GB) | measured ({unit}) | baseline ({unit}) | published ratio | "
             f"measured ratio | size verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in train:
        lines.append(f"| {r.row} {r.script} | {r.technique} | {r.ran_as or 'as asked'} | {r.published_gb:.2f} | "
                     f"{fmt(r.measured_bytes)} | {fmt(r.baseline_bytes)} | {r.published_ratio:.3f} | "
                     f"{ratio(r.measured_ratio)} | {_verdict_cell(r)} |")
    lines += ["", "## Model loading (07): load peak, its own unit and reference (07_01, build then convert)", "",
              f"| row | load | published (GB, load peak reserved) | measured ({unit}, load peak) | "
              f"baseline ({unit}) | published ratio to 07_01 | measured ratio | size verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for r in load:
        lines.append(f"| {r.row} {r.script} | {r.technique} | {r.published_gb:.2f} | {fmt(r.measured_bytes)} | "
                     f"{fmt(r.baseline_bytes)} | {r.published_ratio:.3f} | {ratio(r.measured_ratio)} | "
                     f"{_verdict_cell(r)} |")
    lines += _series_tables([r for r in rows if r.kind == "series"], unit, fmt, ratio)
    lines += ["", "## Each size verdict, with its numbers", ""]
    lines += [f"- {r.row} ({r.claim}): {r.size}" for r in rows if r.size]
    lines += ["", "## The article against its own logs", ""]
    for name, detail in summary.items():
        lines.append(f"- {name} ({claims.CLAIMS_BY_NAME[name].statement}): {detail}")
    (out / "reproduce.md").write_text("\n".join(lines) + "\n")
    (out / "reproduce.json").write_text(json.dumps(
        {"device": device, "scale": scale, "sim_profile": profile, "measured_unit": unit,
         "published_unit": "GB reserved (decimal)",
         "rows": [asdict(r) for r in rows], "text_vs_logs": summary,
         "series": _series_facts(rows)}, indent=2, sort_keys=True) + "\n")
    _plot(rows, device, scale, unit, div, out / "reproduce.png")


def _predicted_on(profile: str | None) -> list[str]:
    """The sim profile the rows were predicted on and the releases it replays (its eras': ``--era``), in one line."""
    from memclaims.report.run_summary import profile_words

    return [] if profile is None else [f"Predicted on the sim, {profile_words(profile)}.", ""]


def _series_facts(rows: list[Row]) -> list[dict[str, object]]:
    from memclaims.report.series import SERIES

    facts: list[dict[str, object]] = []
    for name, title, _names in SERIES:
        mine = [r for r in rows if r.series == name]
        if mine:
            facts.append({"series": name, "title": title, "reference": mine[0].row,
                          "ratios": f"peak memory / {mine[0].row}, published and measured alike"})
    return facts


def _series_tables(rows: list[Row], unit: str, fmt: Callable[[int | None], str],
                   ratio: Callable[[float | None], str]) -> list[str]:
    """One table per series: published beside measured, ratios to the series' first bar."""
    from memclaims.report.series import SERIES

    lines: list[str] = []
    for name, title, _names in SERIES:
        mine = [r for r in rows if r.series == name]
        if not mine:
            continue
        lines += ["", f"## Series {name}: {title}", "",
                  f"Ratios are to the series' first bar ({mine[0].row}). Size verdict: the bar against the bar "
                  "before it: below it, and not below the floor derived from the exact bytes of the bar before "
                  "(memclaims/report/series.py); the published ratios (4 GPUs, article scale) are shown, not asserted.", "",
                  f"| bar | published run | techniques | ran as | published (GB) | measured ({unit}) | published ratio | "
                  "measured ratio | size verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for index, r in enumerate(mine):
            published_gb = "did not run" if r.published_gb is None else f"{r.published_gb:.2f}"
            measured = fmt(r.measured_bytes) if r.measured_bytes is not None else "not run"
            if index == 0 and r.measured_bytes is not None:
                cell = "reference"
            else:
                cell = f"n/a: {r.size.split(':')[0]}" if r.verdict == "n/a" and r.size else _verdict_cell(r)
            lines.append(f"| {r.row} | {r.script} | {r.technique} | {r.ran_as or 'as asked'} | {published_gb} | "
                         f"{measured} | {ratio(r.published_ratio) or 'n/a'} | {ratio(r.measured_ratio) or 'n/a'} | {cell} |")
    return lines


def _verdict_cell(row: Row) -> str:
    if row.verdict == "n/a":
        return "reference" if row.row in (REFERENCE_ROW, "07-1") else "n/a"
    where = "within band" if "within band" in row.size else next(
        (part.strip(" ()") for part in row.size.replace(";", "(").split("(") if part.strip().startswith("outside")),
        "outside band")
    return f"{row.verdict}: {where}"


def _plot(rows: list[Row], device: str, scale: str, unit: str, div: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on CI runners
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.kind == "train"]
    labels = [f"{r.row}\n{r.technique}" + (f"\n(ran {r.ran_as.split(' ')[0]})" if r.ran_as else "") for r in train]
    positions = range(len(train))
    width = 0.4
    measured_name = "predicted" if device == "sim" else "measured"
    series = [r for r in rows if r.kind == "series"]
    names = list(dict.fromkeys(r.series for r in series))
    if names:
        fig = plt.figure(figsize=(15, 10.5))
        grid = fig.add_gridspec(2, max(2, len(names)))
        half = max(2, len(names)) // 2
        left, right = fig.add_subplot(grid[0, :half]), fig.add_subplot(grid[0, half:])
        for column, name in enumerate(names):
            _plot_series(fig.add_subplot(grid[1, column]), [r for r in series if r.series == name], device,
                         scale, measured_name)
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    published_bars = left.bar([p - width / 2 for p in positions], [r.published_ratio or 0 for r in train], width,
                              color="tab:gray", label="published (article scale, CUDA)")
    measured_bars = left.bar([p + width / 2 for p in positions], [r.measured_ratio or 0 for r in train], width,
                             color="tab:blue", label=f"{measured_name} here ({device}, {scale} scale)")
    left.bar_label(published_bars, fmt="%.2f", fontsize=7)
    left.bar_label(measured_bars, fmt="%.2f", fontsize=7)
    left.set_xticks(list(positions), labels, fontsize=7)
    left.set_ylabel("peak memory / fp32 Fabric reference (01-2)")
    left.set_title("ratio to the fp32 reference (one axis for both)")
    left.legend(fontsize=8)
    left.axhline(1.0, color="black", linewidth=0.5)
    same_unit = device in ("cuda", "sim")
    if same_unit:
        pub = right.bar([p - width / 2 for p in positions], [r.published_gb or 0 for r in train], width,
                        color="tab:gray", label="published (GB)")
        right.bar_label(pub, fmt="%.2f", fontsize=7)
    bars = right.bar([p + width / 2 if same_unit else p for p in positions],
                     [0 if r.measured_bytes is None else r.measured_bytes / div for r in train],
                     width if same_unit else 0.6, color="tab:blue", label=f"{measured_name} ({unit})")
    right.bar_label(bars, fmt="%.2f", fontsize=7)
    right.set_xticks(list(positions), labels, fontsize=7)
    right.set_ylabel(unit if not same_unit else "GB reserved (decimal)")
    right.set_title(f"absolute: {measured_name} on {device}" + (" beside published" if same_unit else
                                                                 " (published GB are not comparable: other scale)"))
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_series(axis: Any, rows: list[Row], device: str, scale: str, measured_name: str) -> None:
    """One series: published and measured ratios to its first bar, side by side."""
    width, positions = 0.4, range(len(rows))
    labels = [r.row.split("/", 1)[1].replace("fsdp-", "fsdp\n+ ").replace("checkpointing-", "checkpointing\n+ ") + ("" if r.measured_bytes is not None else "\n(not run here)")
              for r in rows]
    published_bars = axis.bar([p - width / 2 for p in positions], [r.published_ratio or 0 for r in rows], width,
                              color="tab:gray", label="published (4 GPUs, article scale)")
    measured_bars = axis.bar([p + width / 2 for p in positions], [r.measured_ratio or 0 for r in rows], width,
                             color="tab:orange", label=f"{measured_name} here ({device}, {scale} scale)")
    axis.bar_label(published_bars, labels=[f"{r.published_ratio:.2f}" if r.published_ratio is not None else
                                           "did not run" if r.published_gb is None else "n/a" for r in rows], fontsize=7)
    axis.bar_label(measured_bars, labels=[f"{r.measured_ratio:.2f}" if r.measured_ratio is not None else "n/a"
                                          for r in rows], fontsize=7)
    axis.set_xticks(list(positions), labels, fontsize=7)
    axis.set_ylabel(f"peak / {rows[0].row}")
    axis.set_title(f"series {rows[0].series}: ratio to its first bar", fontsize=9)
    axis.axhline(1.0, color="black", linewidth=0.5)
    axis.legend(fontsize=7)
