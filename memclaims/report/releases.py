"""The article's numbers across real releases: ``python -m memclaims.report.releases FILE... --out docs/``.

Each FILE holds the Records one environment measured (``memclaims upgrade --out DIR`` leaves
``DIR/records.jsonl``; ``python -m memclaims.report.candidate --out FILE`` writes one in any environment).
This writes ``releases.md`` (a table per tier: the article's chain, its peak and per-phase bytes
under each release, every change from one release to the next marked) and ``releases.png``.
``EXPLANATIONS`` says why a number moved where the upstream change is known (an issue or PR), and a
change without one is marked unexplained.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from memclaims.core.record import VERSIONED_PACKAGES, Record
from memclaims.techniques.technique_registry import CHAIN as ARTICLE_ROWS

CHAIN = tuple("+".join(t) for t in (*ARTICLE_ROWS, ("bf16-true", "init-module")))
# The article's FSDP runs as the dist tier measures them: rank 0 of two CPU processes (gloo).
FSDP = ("vit-smoke/fsdp", "vit-smoke/fsdp+activation-checkpointing", "bigbird-smoke/fsdp",
        "vit-h14-smoke/16-mixed+fsdp")
# The tiers the history shows: exact CPU bytes at smoke scale (one process, and FSDP's rank 0), and
# what the installed torch itself allocates at article scale on the sim's ``current`` profile.
# Each tier's plot shows the metric that moved across releases (FSDP's moved at the optimizer step).
TIERS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "cpu": (tuple(f"vit-smoke/{t}" for t in CHAIN), "exact live bytes on the CPU, smoke scale", "peak"),
    "dist": (FSDP, "exact live bytes of rank 0 of two CPU processes (FSDP over gloo), smoke scale",
             "optimizer_step"),
    "sim-current": (tuple(f"vit-article/{t}" for t in CHAIN),
                    "predicted CUDA reserved bytes, article scale, sim profile current", "peak"),
}
PHASES = ("load", "forward", "backward", "optimizer_step", "zero_grad")

# (tier, metric, release where it moved) -> why, with the upstream change. Filled in from the
# releases' notes and the trackers; a move not listed here is reported as unexplained.
EXPLANATIONS: dict[tuple[str, str, str], str] = {
    ("cpu", "load", "torch 2.12.1"): (
        "torch's nn.init.trunc_normal_ moved from the in-place inverse CDF (uniform_, erfinv_, clamp_) to "
        "normal_ with resampling (pytorch/pytorch PR #174997, for issue #145498: erfinv in low precision "
        "clamped outliers to the bounds); its masks (x < a, x > b and their union, one bool per element) "
        "are alive while torchvision's ViT initialises its patch embedding: up to 3 B x its 1,536 elements = "
        "4,608 B at smoke scale where that initialisation is the load's peak (fp32), 1,536 B where the "
        "peak comes with the bf16 conversion"),
}


@dataclass(frozen=True)
class Run:
    label: str  # what differs from the other runs' stack: "torch 2.9.1", "lightning 2.5.6"
    versions: dict[str, str | None]
    records: dict[tuple[str, str], Record]  # (tier, recipe) -> Record


def _version_key(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "0").split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def load(paths: Iterable[Path], reference: dict[str, str | None]) -> list[Run]:
    """One Run per file, labelled by the tested libraries that differ from ``reference`` (this
    interpreter's stack; a torchvision that moves with its torch is not named), oldest first."""
    runs = []
    for path in paths:
        records: dict[tuple[str, str], Record] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line) if line.strip() else {}
            if "record" in entry and entry["record"].get("rank", 0) == 0:
                record = Record.from_dict(entry["record"])
                records[(str(entry["tier"]), record.recipe)] = record
        if not records:
            continue
        versions = next(iter(records.values())).versions
        moved = [p for p in VERSIONED_PACKAGES if versions.get(p) != reference.get(p)]
        if "torch" in moved and "torchvision" in moved:
            moved.remove("torchvision")
        runs.append(Run(", ".join(f"{p} {versions.get(p)}" for p in moved) or "this stack", versions, records))
    return sorted(runs, key=lambda run: tuple(_version_key(run.versions.get(p)) for p in VERSIONED_PACKAGES))


def _value(record: Record | None, metric: str) -> int | None:
    if record is None:
        return None
    if metric == "peak":
        return record.peak_reserved_total_bytes or record.peak_allocated_bytes
    return record.phases.get(metric, {}).get("allocated_bytes")


def _fmt(value: int | None, tier: str) -> str:
    if value is None:
        return "-"
    return f"{value / 1e9:.3f}" if tier.startswith("sim") else f"{value:,}"


def markdown(runs: Sequence[Run]) -> str:
    lines = ["# The article's numbers across releases", "",
             "Generated by `python -m memclaims.report.releases` from the Records `memclaims upgrade` measured in each "
             "environment. A cell in **bold** moved from the release before it; the notes under each table say why, "
             "or that the reason is unknown.", ""]
    lines += [f"- {run.label}: " + ", ".join(f"{p} {run.versions.get(p)}" for p in VERSIONED_PACKAGES)
              for run in runs]
    for tier, (recipes, what, _) in TIERS.items():
        unit = "GB (decimal, reserved)" if tier.startswith("sim") else "B (allocated, exact)"
        lines += ["", f"## {tier}: {what}", "",
                  f"| recipe | metric ({unit}) | " + " | ".join(run.label for run in runs) + " |",
                  "|---|---|" + "---|" * len(runs)]
        moves: dict[tuple[str, str], list[str]] = {}  # (metric, release) -> "recipe: before -> after"
        one_workload = len({recipe.partition("/")[0] for recipe in recipes}) == 1
        for recipe in recipes:
            techniques = recipe.partition("/")[2] if one_workload else recipe  # the notes' name for it
            for metric in ("peak", *PHASES):
                values = [_value(run.records.get((tier, recipe)), metric) for run in runs]
                if all(v is None for v in values):
                    continue
                cells = []
                for index, value in enumerate(values):
                    before = values[index - 1] if index else None
                    moved = index > 0 and value is not None and before is not None and value != before
                    cells.append(f"**{_fmt(value, tier)}**" if moved else _fmt(value, tier))
                    if moved and before and value is not None:
                        change = (value - before) / before * 100
                        moves.setdefault((metric, runs[index].label), []).append(
                            f"{techniques} {_fmt(before, tier)} -> {_fmt(value, tier)} ({change:+.1f} %)")
                lines.append(f"| {recipe} | {metric} | " + " | ".join(cells) + " |")
        notes = [f"- {metric} at {release}: {'; '.join(moved)}. Why: "
                 f"{EXPLANATIONS.get((tier, metric, release), 'unexplained')}"
                 for (metric, release), moved in moves.items()]
        lines += ["", *(notes or ["No number moved between these releases."])]
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Run], path: Path) -> None:
    """One panel per tier: each recipe's plotted metric (``TIERS``) across the releases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(TIERS), figsize=(7 * len(TIERS), 4.5))
    for axis, (tier, (recipes, what, metric)) in zip(axes, TIERS.items()):
        scale = 1e9 if tier.startswith("sim") else 2**10
        for recipe in recipes:
            values = [_value(run.records.get((tier, recipe)), metric) for run in runs]
            axis.plot(range(len(runs)), [v / scale if v is not None else float("nan") for v in values],
                      marker="o", label=recipe)
        axis.set_xticks(range(len(runs)), [run.label for run in runs], rotation=30, ha="right", fontsize=8)
        axis.set_ylabel("GB (decimal)" if tier.startswith("sim") else "KiB")
        axis.set_title(f"{what}: {metric}", fontsize=9)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memclaims.report.releases", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="records.jsonl of each environment")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"no such file: {missing[0]}")
    from memclaims.core.record import library_versions

    runs = load(args.files, library_versions())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "releases.md").write_text(markdown(runs), encoding="utf-8")
    plot(runs, args.out / "releases.png")
    print(f"wrote {args.out / 'releases.md'} and {args.out / 'releases.png'} ({len(runs)} releases)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
