"""Trends across runs: ``memclaims history DIR`` reads the summary JSON of many pytest runs (one per
night, as a CI keeps its artifacts), follows each metric over time and names the first run where it
moved beyond its tolerance, with the library versions that changed since the run before.

Like is compared with like: a series is one (baseline environment, case, metric), so runs on another
CPU class or GPU, and runs that selected other cases, never meet in one series; a run that did not
measure a metric leaves a gap, and the step before it is the last run that did. The tolerance is the
one the comparison row carried (the baseline's, memclaims.baselines.compare): memory and the loss
trajectory relative, accuracy in absolute points, step time only where a threshold was set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from memclaims.baselines.compare import ACCURACY, LOSSES, STEP_TIME, fmt_short
from memclaims.core.errors import UsageError
from memclaims.report.summary_document import load

# A series is one (environment, case, metric).
Key = tuple[str, str, str]


@dataclass(frozen=True)
class Run:
    path: Path
    started: str  # ISO time in UTC; the file's modification time for a summary without one
    versions: dict[str, str | None]
    values: dict[Key, tuple[float, float | None]]  # value now, its tolerance


@dataclass(frozen=True)
class Move:
    key: Key
    run: int  # index into Trends.runs: the first run where the metric moved beyond its tolerance
    before: float
    now: float
    tolerance: float
    versions_changed: dict[str, tuple[str | None, str | None]]  # package -> (run before, this run)


@dataclass
class Trends:
    root: Path
    runs: list[Run]
    series: dict[Key, list[tuple[int, float]]] = field(default_factory=dict)  # run index, value
    moves: list[Move] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"runs": [{"path": str(r.path), "started": r.started, "versions": r.versions} for r in self.runs],
                "series": [{"environment": k[0], "case": k[1], "metric": k[2],
                            "values": [{"run": i, "value": v} for i, v in points]}
                           for k, points in sorted(self.series.items())],
                "first_moves": [{"environment": m.key[0], "case": m.key[1], "metric": m.key[2],
                                 "run": str(self.runs[m.run].path), "started": self.runs[m.run].started,
                                 "before": m.before, "now": m.now, "tolerance": m.tolerance,
                                 "versions_changed": {p: list(v) for p, v in m.versions_changed.items()}}
                                for m in self.moves]}


def moved(metric: str, before: float, now: float, tolerance: float | None) -> bool:
    """Beyond tolerance in either direction: a night-to-night step that large is news either way."""
    if tolerance is None:
        return False  # step time without a threshold, accuracy short of its plateau: reported only
    if metric == ACCURACY:
        return abs(now - before) > tolerance + 1e-12
    change_pct = (now - before) / abs(before) * 100.0 if before else (0.0 if now == before else float("inf"))
    if metric == STEP_TIME:
        return abs(change_pct) > tolerance  # a threshold in percent (--memclaims-time-threshold)
    return abs(change_pct) > tolerance * 100.0  # memory and LOSSES: a fraction of the baseline


def _run(path: Path) -> Run | None:
    try:
        data = load(path)
    except UsageError:
        return None  # another JSON kept beside the summaries (claims-last-run.json, a Record)
    session = data["session"]
    started = session.get("started") or _mtime(path)
    values: dict[Key, tuple[float, float | None]] = {}
    for row in data["rows"]:
        if isinstance(row.get("now"), (int, float)) and row.get("metric") not in (None, "-"):
            values[(str(row.get("environment", "")), str(row["case"]), str(row["metric"]))] = \
                (float(row["now"]), row.get("tolerance"))
    return Run(path, str(started), dict(session.get("versions", {})), values)


def _mtime(path: Path) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(path.stat().st_mtime))


def changed_versions(before: Run, now: Run) -> dict[str, tuple[str | None, str | None]]:
    names = sorted(set(before.versions) | set(now.versions))
    return {n: (before.versions.get(n), now.versions.get(n)) for n in names
            if before.versions.get(n) != now.versions.get(n)}


def read_runs(root: Path) -> Trends:
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder; give the folder that holds the runs' summary JSON files "
                         f"(pytest --memclaims-summary-json)")
    runs = [r for r in (_run(p) for p in sorted(root.rglob("*.json"))) if r is not None]
    if not runs:
        raise UsageError(f"{root}: no memclaims summary JSON in it; each run writes one with pytest "
                         f"--memclaims-summary-json PATH")
    runs.sort(key=lambda r: (r.started, str(r.path)))
    trends = Trends(root, runs)
    for index, run in enumerate(runs):
        for key, (value, _) in run.values.items():
            trends.series.setdefault(key, []).append((index, value))
    for key, points in sorted(trends.series.items()):
        for (before_index, before), (index, now) in zip(points, points[1:]):
            tolerance = runs[index].values[key][1]
            if moved(key[2], before, now, tolerance):
                assert tolerance is not None
                trends.moves.append(Move(key, index, before, now, tolerance,
                                         changed_versions(runs[before_index], runs[index])))
                break
    trends.moves.sort(key=lambda m: (m.run, m.key))
    return trends


def _fmt(metric: str, value: float) -> str:
    if metric == ACCURACY:
        return f"{value * 100:.2f} %"
    if metric == LOSSES:
        return f"{value:.4f}"
    return fmt_short(metric, value)


def _fmt_tolerance(metric: str, tolerance: float) -> str:
    if metric == ACCURACY:
        return f"{tolerance * 100:.2f} points"
    return f"{tolerance:.2f} %" if metric == STEP_TIME else f"{tolerance * 100:.2f} %"


def table(trends: Trends) -> list[str]:
    runs = trends.runs
    environments = sorted({k[0] for k in trends.series})
    lines = [f"{len(runs)} runs in {trends.root} ({runs[0].started} .. {runs[-1].started}); "
             f"{len(trends.series)} series (environment, case, metric) over {len(environments)} environment(s)"]
    for index, run in enumerate(runs):
        lines.append(f"  run {index:>2}  {run.started}  {run.path.relative_to(trends.root)}  "
                     f"{len(run.values)} metrics")
    if not trends.moves:
        lines.append("no metric moved beyond its tolerance between two runs")
        return lines
    lines.append("")
    lines.append(f"first run where each metric moved beyond its tolerance ({len(trends.moves)} of "
                 f"{len(trends.series)} series):")
    for move in trends.moves:
        environment, case, metric = move.key
        run = runs[move.run]
        changed = ", ".join(f"{p} {a} -> {b}" for p, (a, b) in move.versions_changed.items()) or \
            "no library version changed"
        change = f"{(move.now - move.before) * 100:+.2f} points" if metric == ACCURACY else \
            f"{(move.now - move.before) / abs(move.before) * 100:+.2f} %" if move.before else "from 0"
        lines.append(f"  run {move.run} ({run.started}, {run.path.relative_to(trends.root)}): {case} {metric} "
                     f"[{environment}] {_fmt(metric, move.before)} -> {_fmt(metric, move.now)} ({change}, "
                     f"tolerance {_fmt_tolerance(metric, move.tolerance)}); changed since the run before: {changed}")
        values = " ".join(_fmt(metric, v) if i != move.run else f"[{_fmt(metric, v)}]"
                          for i, v in trends.series[move.key])
        lines.append(f"      over the runs: {values}")
    return lines


PLOTTED_SERIES = 20  # more lines than this are unreadable in one plot; the table lists every move


def drawn(trends: Trends) -> dict[tuple[str, str, str], list[tuple[int, float]]]:
    """The series the plot draws, each relative to its first run: only those that moved (every flat series
    drawn says nothing and hides the point), and none that starts at 0 bytes (no ratio to 0: drawn as 0 it
    would read as a 100 % drop; the table says "from 0")."""
    out: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for move in trends.moves:
        points = trends.series[move.key]
        first = points[0][1]
        if first and move.key not in out and len(out) < PLOTTED_SERIES:
            out[move.key] = [(i, v / first) for i, v in points]
    return out


def plot(trends: Trends, path: Path) -> Path:
    """Each moved series relative to its first run, its first move marked; with none moved, a plot that says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = drawn(trends)
    figure, axes = plt.subplots(figsize=(10, 5))
    for key, points in series.items():
        axes.plot([i for i, _ in points], [v for _, v in points], marker="o", label=f"{key[1]} {key[2]}")
    for move in trends.moves:
        if move.key in series:
            axes.annotate("moved", (move.run, dict(series[move.key])[move.run]), textcoords="offset points",
                          xytext=(0, 8), ha="center", color="#cf222e")
    unplotted = len({m.key for m in trends.moves}) - len(series)
    if not series:
        axes.text(0.5, 0.5, "no metric moved beyond its tolerance" if not trends.moves else
                  "every moved series starts at 0 (the table lists them)", ha="center", va="center",
                  transform=axes.transAxes)
    axes.set_xticks(range(len(trends.runs)), [r.started[:10] for r in trends.runs], rotation=45, ha="right")
    axes.set_ylabel("relative to the series' first run")
    title = f"memclaims history: {len(trends.runs)} runs, {len(trends.moves)} metric(s) moved"
    axes.set_title(title + (f" ({unplotted} not drawn: from 0 or past {PLOTTED_SERIES})" if unplotted else ""))
    if series:
        axes.legend(fontsize="x-small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
