"""Direction-aware comparison of a Record with its baseline.

Memory fails only when memory used grows beyond tolerance, accuracy only when it drops; being better
than the baseline beyond tolerance is "stale" (the baseline should be refreshed), which fails only in
strict mode. Step time is reported, and fails only when the user sets a threshold. A derived figure
(a phase's peak above its start) explains a failure and is reported, but never fails alone: it rises
when the start falls further than the peak, i.e. on an improvement.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memclaims.core.record import Record

# The whole run's peaks: each is the largest of its phases' peaks.
RUN_PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_reserved_total_bytes")
MEMORY_METRICS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_reserved_total_bytes", "load_peak_bytes",
                  "optimizer_state_bytes", "param_bytes", "grad_bytes")
# Each phase of a Record (load, forward, backward, optimizer_step, zero_grad, evaluation...) is
# compared on these keys, as metric ``phases.<phase>.<key>`` with the memory tolerance.
PHASE_KEYS = ("allocated_bytes", "above_start_bytes", "reserved_bytes")
# Differences of two measured numbers: the peak above what was live at the phase's start, and that
# start (allocated - above_start). Judged through the absolute peaks they come from, never alone: a
# library that frees memory before the backward lowered every peak of the affected cases by 10-15 %
# and raised backward's above-start by 75 %. A start that fell is reported as an improvement.
START = "start_bytes"
DERIVED_PHASE_KEYS = ("above_start_bytes", START)
# What CPU offload keeps on the host (Record.host_state_bytes), as metric
# ``host_state.<category>_bytes`` with the memory tolerance: more host bytes for the same recipe is a
# regression of host memory.
HOST_STATE = "host_state"
ACCURACY = "accuracy"
STEP_TIME = "step_time_s"
# The losses of the measured steps: deterministic on a CPU class (ATen's avx2 and default kernels
# moved them by at most 0.004 % at smoke scale), while Adam's learning rate 10x too high moved
# them by 1.9 %, 10x too low by 0.13 % and broken gradient accumulation by 0.22 % within three
# steps, where accuracy at smoke scale moves by less than its cross-class tolerance. Compared in
# both directions: a trajectory that changed is training something else.
LOSSES = "memory_losses"
METRICS = MEMORY_METRICS + (ACCURACY, STEP_TIME)

OK, REGRESSION, STALE, INFO, MISSING, NEW = "ok", "regression", "stale", "info", "missing", "new"
# The detail of a derived figure that grew beyond tolerance (verdict INFO): it explains, it does not fail.
DERIVED_GREW = "derived from the phase's peak and start: explains a failure of the peaks, never fails alone"
# Worst first: what decides a Comparison's own verdict (a reported step time leaves it ok).
SEVERITY = (REGRESSION, MISSING, STALE, NEW)

# Memory: relative fraction of the baseline. Accuracy: absolute fraction (0.02 = 2 points).
# The cpu and sim tiers are deterministic, so their tolerances only absorb rounding; the gpu
# tier absorbs allocator and kernel-selection noise.
_DEFAULTS: dict[str, dict[str, float | None]] = {
    "cpu": {**{m: 0.005 for m in MEMORY_METRICS}, ACCURACY: 0.02, STEP_TIME: None, LOSSES: 0.001},
    "sim": {**{m: 0.005 for m in MEMORY_METRICS}, ACCURACY: 0.02, STEP_TIME: None, LOSSES: 0.001},
    "cuda": {**{m: 0.03 for m in MEMORY_METRICS}, ACCURACY: 0.02, STEP_TIME: None, LOSSES: 0.01},
}

MIB = 1024 * 1024
DISTRIBUTED_PHASE_TOLERANCE = 0.10


def default_tolerances(device: str) -> dict[str, float | None]:
    return dict(_DEFAULTS.get(device, _DEFAULTS["cuda"]))


def spread_tolerances(records: Sequence[Record], factor: float = 3.0) -> dict[str, float | None]:
    """max(the tier's floor, factor x relative spread) per memory metric and for accuracy."""
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
    return tolerances


@dataclass
class MetricResult:
    metric: str
    baseline: float | None
    now: float | None
    change_pct: float | None  # relative change in percent (accuracy: points, see `change`)
    tolerance: float | None
    verdict: str
    detail: str = ""  # where within the metric, e.g. the step of a loss trajectory

    def fails(self, strict: bool) -> bool:
        return self.verdict in (REGRESSION, MISSING) or (strict and self.verdict == STALE)

    @property
    def phase(self) -> str | None:
        return self.metric.split(".")[1] if self.metric.startswith("phases.") else None

    @property
    def explains(self) -> bool:
        """A derived figure that grew beyond tolerance: named beside the failures it explains."""
        return self.detail == DERIVED_GREW


def is_derived(metric: str) -> bool:
    return metric.startswith("phases.") and metric.rsplit(".", 1)[-1] in DERIVED_PHASE_KEYS


def fmt_value(metric: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if metric.endswith("_bytes"):
        return f"{int(value):,} B ({_mib(value)} MiB)"
    if metric == ACCURACY:
        return f"{value * 100:.2f} %"
    if metric.endswith("_s"):
        return f"{value * 1000:.1f} ms"
    if metric == LOSSES:
        return f"{value:.4f}"
    return str(value)


def fmt_change(result: MetricResult) -> str:
    if result.baseline is None or result.now is None:
        return "n/a"
    if result.metric == ACCURACY:
        return f"{(result.now - result.baseline) * 100:+.2f} points"
    return "n/a" if result.change_pct is None else f"{result.change_pct:+.2f} %"


def fmt_tolerance(result: MetricResult) -> str:
    if result.tolerance is None:
        return "none set"
    if result.metric == ACCURACY:
        return f"-{result.tolerance * 100:.2f} points"
    if result.metric == STEP_TIME:
        return f"+{result.tolerance:.2f} %"
    if result.metric == LOSSES:
        return f"±{result.tolerance * 100:.2f} %"
    return f"+{result.tolerance * 100:.2f} %"


def environment_diff(before: Record, now: Record) -> str:
    """What changed since the baseline, e.g. ``torch 2.13.0 -> 2.14.1, lightning unchanged``."""
    from memclaims.core.environment import describe

    parts: list[str] = []
    if before.environment != now.environment:
        parts.append(f"baseline from {describe(before.environment)}, this machine {describe(now.environment)}")
    if before.device_name != now.device_name:
        parts.append(f"device {before.device_name} -> {now.device_name}")
    unchanged: list[str] = []
    for package in sorted(set(before.versions) | set(now.versions)):
        old, new = before.versions.get(package), now.versions.get(package)
        if old == new:
            unchanged.append(package)
        else:
            parts.append(f"{package} {old or 'absent'} -> {new or 'absent'}")
    if unchanged:
        parts.append(", ".join(f"{p} unchanged" for p in unchanged))
    return ", ".join(parts) if parts else "nothing recorded changed"


@dataclass
class Comparison:
    case_id: str
    recipe: str
    results: list[MetricResult]
    environment_change: str
    strict: bool = False
    environment: str = ""  # the baseline file's environment id, for the end-of-run table

    @property
    def failures(self) -> list[MetricResult]:
        return [r for r in self.results if r.fails(self.strict)]

    @property
    def verdict(self) -> str:
        verdicts = {r.verdict for r in self.results}
        return next((v for v in SEVERITY if v in verdicts), OK)

    def message(self) -> str:
        lines = []
        failures = self.failures
        for r in failures + ([r for r in self.results if r.explains] if failures else []):
            what = {REGRESSION: "moved beyond its tolerance" if r.metric == LOSSES else "got worse than its baseline",
                    STALE: "is better than its baseline (stale baseline; refresh with --update-baselines)",
                    MISSING: "was not measured, but the baseline has it (a probe or phase stopped "
                             "reporting)"}.get(r.verdict, r.verdict)
            if r.explains:
                what = "got worse than its baseline, explaining the failures above"
            where = f" ({r.detail})" if r.detail and not r.explains else ""
            lines.append(f"{self.case_id}: {r.metric}{where} {what}: baseline {fmt_value(r.metric, r.baseline)}, "
                         f"now {fmt_value(r.metric, r.now)}, change {fmt_change(r)} "
                         f"(tolerance {fmt_tolerance(r)})")
        lines.append(f"environment since the baseline: {self.environment_change}")
        return "\n".join(lines)

    def rows(self) -> list[dict[str, Any]]:
        return [{"case": self.case_id, "environment": self.environment, **asdict(r), "change": fmt_change(r),
                 "environment_change": self.environment_change} for r in self.results]


def _relative_pct(before: float, now: float) -> float | None:
    if before == 0:
        return 0.0 if now == 0 else None
    return (now - before) / before * 100.0


def measured_metrics(record: Record) -> dict[str, float | None]:
    """Every compared number of a Record, by metric name (phases flattened)."""
    values: dict[str, float | None] = {m: getattr(record, m) for m in METRICS}
    for phase, peaks in sorted(record.phases.items()):
        for key in PHASE_KEYS:
            if key in peaks:
                values[f"phases.{phase}.{key}"] = peaks[key]
        if peaks.get("allocated_bytes") is not None and peaks.get("above_start_bytes") is not None:
            values[f"phases.{phase}.{START}"] = peaks["allocated_bytes"] - peaks["above_start_bytes"]
    for category, size in sorted(record.host_state_bytes.items()):
        values[f"{HOST_STATE}.{category}_bytes"] = size
    return values


def _tolerance(metric: str, tolerances: Mapping[str, float | None]) -> float | None:
    if metric in tolerances:
        return tolerances[metric]
    if metric.startswith(("phases.", f"{HOST_STATE}.")):
        return tolerances.get("phases", tolerances.get("peak_allocated_bytes"))
    return None


def _verdict(metric: str, before: float, now: float, change: float | None, tolerance: float | None) -> str:
    if metric.endswith("_bytes"):
        limit = (tolerance or 0.0) * 100.0
        if change is None or change > limit:
            return REGRESSION
        return STALE if change < -limit else OK
    if metric == ACCURACY:
        limit = tolerance or 0.0
        if now < before - limit - 1e-12:
            return REGRESSION
        return STALE if now > before + limit + 1e-12 else OK
    # step time: reported, judged only against the user's threshold
    if tolerance is None:
        return INFO
    return REGRESSION if change is None or change > tolerance else OK


def compare_losses(before: list[float | None], now: list[float | None],
                   tolerance: float | Sequence[float] | None) -> MetricResult | None:
    """The measured steps' losses, step by step; the result names the step that moved most beyond
    its tolerance (else the one that moved most). ``tolerance``: one fraction for every step, or one
    per step (the last repeats): a numerics change moves a trajectory more with every step."""
    if not before and not now:
        return None
    per_step = [tolerance] if tolerance is None or isinstance(tolerance, (int, float)) else list(tolerance)

    def allowed(step: int) -> float | None:
        return per_step[min(step, len(per_step) - 1)]

    if not now:
        return MetricResult(LOSSES, None, None, None, allowed(0), MISSING, "no losses recorded")
    worst: tuple[float, float, int] | None = None  # (change / its tolerance, change, step)
    for step, (b, n) in enumerate(zip(before, now)):
        if (b is None) != (n is None):  # one side diverged to NaN/inf at this step
            return MetricResult(LOSSES, b, n, None, allowed(step), REGRESSION,
                                f"step {step}: {'diverged' if n is None else 'no longer diverges'}")
        if b is None or n is None:
            continue
        change = (n - b) / abs(b) * 100.0 if b else (0.0 if n == b else float("inf"))
        limit = (allowed(step) or 0.0) * 100.0
        excess = abs(change) / limit if limit else (float("inf") if change else 0.0)
        if worst is None or excess > worst[0]:
            worst = (excess, change, step)
    if worst is None:
        return None
    excess, change, step = worst
    return MetricResult(LOSSES, before[step], now[step], change, allowed(step), REGRESSION if excess > 1 else OK,
                        f"step {step}")


def compare(record: Record, baseline: Record, tolerances: Mapping[str, float | None] | None = None, *,
            case_id: str | None = None, time_threshold_pct: float | None = None,
            strict: bool = False, environment: str = "", loss_tolerances: Sequence[float] | None = None) -> Comparison:
    """Compare ``record`` with ``baseline``; ``tolerances`` override the tier's defaults per metric
    (a ``phases`` entry sets every phase metric at once); ``loss_tolerances``: one per step of the
    loss trajectory instead of the tier's one (memclaims.baselines.noise, for a changed library or CPU class)."""
    tol: dict[str, float | None] = default_tolerances(record.device)
    if record.devices > 1:
        # A rank frees its collectives' buffers as communication completes, so within a phase the
        # peak above its start moved by up to 4 % between two identical runs (FSDP2 over gloo).
        tol["phases"] = DISTRIBUTED_PHASE_TOLERANCE
        if record.device != "sim":
            # Real ranks' run peaks are their largest phase peak, with the same noise: vit-smoke/tensor-parallel@4 on
            # 2 cores put +69,632 B (+3.1 % of the run's peak) on one rank's forward in one step, a different rank
            # each run. The sim's ranks replay no communication timing: their run peaks keep the tier's tolerance.
            tol.update({metric: DISTRIBUTED_PHASE_TOLERANCE for metric in RUN_PEAKS})
    tol.update(tolerances or {})
    if time_threshold_pct is not None:
        tol[STEP_TIME] = time_threshold_pct
    before_values, now_values = measured_metrics(baseline), measured_metrics(record)
    results: list[MetricResult] = []
    for metric in list(before_values) + [m for m in now_values if m not in before_values]:
        before, now = before_values.get(metric), now_values.get(metric)
        if before is None and now is None:
            continue  # not measured on this tier (peak_reserved_bytes on the CPU)
        tolerance = _tolerance(metric, tol)
        if now is None and is_derived(metric):  # its phase's allocated peak, judged, says it went missing
            results.append(MetricResult(metric, before, now, None, tolerance, INFO, "derived: not measured now"))
        elif now is None:  # the baseline has it and this run does not: never a silent pass
            results.append(MetricResult(metric, before, now, None, tolerance, MISSING))
        elif before is None:  # measured now, not in the baseline: refresh it to start comparing
            results.append(MetricResult(metric, before, now, None, tolerance, NEW))
        elif metric == ACCURACY and not record.accuracy_schedule.get("plateau"):
            # Short of its plateau a run's accuracy moves by points under a mere numerics change
            # (another torch, another CPU class): reported, asserted only where trained to it.
            results.append(MetricResult(metric, before, now, _relative_pct(before, now), None, INFO,
                                        "reported: this scale does not train to a plateau"))
        else:
            change = _relative_pct(before, now)
            verdict = _verdict(metric, before, now, change, tolerance)
            if verdict == REGRESSION and is_derived(metric):
                results.append(MetricResult(metric, before, now, change, tolerance, INFO, DERIVED_GREW))
            else:
                results.append(MetricResult(metric, before, now, change, tolerance, verdict))
    losses = compare_losses(baseline.memory_losses, record.memory_losses,
                            loss_tolerances if loss_tolerances is not None else tol.get(LOSSES))
    if losses is not None:
        results.append(losses)
    return Comparison(case_id=case_id or record.recipe, recipe=record.recipe, results=results,
                      environment_change=environment_diff(baseline, record), strict=strict,
                      environment=environment)


# Verdicts of the fixtures (not of a metric) in the end-of-run table, placed among SEVERITY's.
NO_BASELINE, REFUSED, UPDATED = "no baseline", "refused", "updated"
_TABLE_ORDER = (REGRESSION, REFUSED, MISSING, NO_BASELINE, STALE, NEW, UPDATED, INFO, OK)


@dataclass
class Summary:
    """Every comparison of a session, for the terminal table and the JSON file."""

    rows: list[dict[str, object]] = field(default_factory=list)

    def add(self, comparison: Comparison) -> None:
        self.rows.extend(comparison.rows())

    def add_note(self, case_id: str, verdict: str, environment: str = "") -> None:
        self.rows.append({"case": case_id, "environment": environment, "metric": "-", "baseline": None,
                          "now": None, "change_pct": None, "change": "", "tolerance": None, "verdict": verdict})

    def worst_first(self, everything: bool = False) -> list[dict[str, Any]]:
        """The rows that need a look (not ok, not merely reported), worst first; all with ``everything``."""
        rows = self.rows if everything else [r for r in self.rows if r["verdict"] not in (OK, INFO)]
        order = {v: i for i, v in enumerate(_TABLE_ORDER)}
        return sorted(rows, key=lambda r: (order.get(r["verdict"], len(order)), -abs(r["change_pct"] or 0.0)))

    def table(self, everything: bool = False) -> list[str]:
        header = ("case", "environment", "metric", "baseline", "now", "change", "verdict")
        body = [(r["case"], r.get("environment", ""), r["metric"], fmt_short(r["metric"], r["baseline"]),
                 fmt_short(r["metric"], r["now"]), r["change"], r["verdict"]) for r in self.worst_first(everything)]
        if not body:
            return []
        widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
        return ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *body]]


def fmt_short(metric: str, value: float | None) -> str:
    if value is None:
        return ""
    if metric.endswith("_bytes"):
        return f"{_mib(value)} MiB"
    return fmt_value(metric, value)


def _mib(value: float) -> str:
    # Smoke-scale tensors are kilobytes: two decimals of MiB would print them all as 0.00.
    return f"{value / MIB:.2f}" if abs(value) >= MIB else f"{value / MIB:.4f}"
