"""Where the measured noise comes from: ``memclaims baselines spread`` writes the tolerance file.

memclaims.baselines.noise reads it; this module measures it, in one pass, on this machine:

- **seeds**: every converged case (memclaims.claims.accuracy.CONVERGED_CASES) at the article's seed and
  ``SEEDS``: the spread a reseed causes, the seeds a case reruns with after a change, and the
  same-seed differences of each "keeps accuracy" claim's pair;
- **mutations**: each claim's candidate with the learning rate x10 or /10 and (with accumulation)
  gradients never zeroed: the drops a claim's tolerance must still catch;
- **changes**: the Records of the same cases under another CPU class (``--classes``: the worker
  ``python -m memclaims.report.candidate`` runs under ``ATEN_CPU_CAPABILITY``) and under real library
  releases (``--changes FILE``: what ``memclaims upgrade`` or the worker measured in another
  environment), each against the committed baselines: how far a numerics change moves a converged
  accuracy, and each step of a loss trajectory.

Tolerances: ``same`` (a baseline of this class and versions) is ``SAME_FLOOR``; ``change`` is
``CHANGE_MARGIN`` x the largest accuracy change seen, at least ``CHANGE_FLOOR``; a claim's is
memclaims.claims.accuracy.tolerance_from over its same-seed differences; a loss step's is
``LOSS_MARGIN`` x the largest relative change seen at that step, at least ``LOSS_FLOOR``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memclaims.core import progress
from memclaims.core.record import Record

SEEDS = (123, 1, 2, 3, 4)  # the article's (and every baseline's) first
SAME_FLOOR = 0.005  # 2 of the digits' 359 test images: one class and one stack run deterministically
CHANGE_FLOOR = 0.01
CHANGE_MARGIN = 1.5  # the releases measured are a sample: the next one may move a little further
LOSS_FLOOR = 0.001  # the loss tolerance within one class and stack (memclaims.baselines.compare's default)
LOSS_MARGIN = 2.0
LOSS_TIERS = ("cpu", "converged", "dist")  # the tiers whose cases compare a loss trajectory with a baseline


def converged_accuracy(techniques: tuple[str, ...], seed: int) -> float:
    from memclaims.core.names import CONVERGED
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    record = run_recipe(resolve("vit", CONVERGED, techniques), RunOptions(device="cpu", seed=seed))[0]
    assert record.accuracy is not None
    return record.accuracy


def _progress(text: str) -> None:
    progress.say(f"memclaims spread: {text}")


def measure_seeds(seeds: Sequence[int]) -> dict[str, dict[str, float]]:
    """Accuracy of every converged case at every seed, in this process."""
    from memclaims.claims import accuracy
    from memclaims.core.names import CONVERGED
    from memclaims.recipes.recipe import resolve

    out: dict[str, dict[str, float]] = {}
    for techniques in progress.steps(accuracy.CONVERGED_CASES, "memclaims spread: seeds"):
        recipe_id = resolve("vit", CONVERGED, techniques).id
        out[recipe_id] = {str(s): round(converged_accuracy(techniques, s), 4) for s in seeds}
        _progress(f"{recipe_id} {out[recipe_id]}")
    return out


def measure_mutations(seed: int) -> dict[str, dict[str, float]]:
    """Each cpu claim's candidate under each mutation (memclaims.claims.accuracy.MUTATIONS), at ``seed``."""
    from memclaims.claims import accuracy

    mutated: dict[str, dict[str, float]] = {}
    candidates = sorted({p.on("cpu")[0] for p in accuracy.PAIRS if "cpu" in p.tiers})
    for name, make in progress.steps(accuracy.MUTATIONS.items(), "memclaims spread: mutations",
                                     total=len(accuracy.MUTATIONS)):
        mutated[name] = {}
        for candidate in candidates:
            if name == "accumulation-never-zeroed" and "grad-accum" not in candidate:
                continue
            with make():
                mutated[name]["+".join(candidate)] = round(converged_accuracy(candidate, seed), 4)
            _progress(f"{name} {'+'.join(candidate)} {mutated[name]['+'.join(candidate)]}")
    return mutated


def measure_class(cpu_class: str, out: Path, tiers: str = "cpu,converged,dist") -> Path:
    """The worker's Records under ATen's ``cpu_class`` (read once, at import: a fresh interpreter)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cpu_class}
    subprocess.run([sys.executable, "-m", "memclaims.report.candidate", "--out", str(out), "--tiers", tiers],
                   env=env, check=True)
    return out


def read_records(path: Path) -> list[tuple[str, Record]]:
    """(tier, Record) of every line of a worker's file measured at the article's seed (a line with
    ``"seed"`` is a rerun at another seed, read by whoever decides an accuracy with them)."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line) if line.strip() else {}
        if "record" in entry and "seed" not in entry:
            found.append((str(entry["tier"]), Record.from_dict(entry["record"])))
    return found


def change_label(record: Record, baseline: Record) -> str:
    """What differs from the baseline's stack: ``torch 2.9.1``, ``class default``, or both."""
    from memclaims.core.environment import describe
    from memclaims.core.record import VERSIONED_PACKAGES

    parts = [f"{p} {record.versions.get(p)}" for p in VERSIONED_PACKAGES
             if record.versions.get(p) != baseline.versions.get(p)]
    if record.environment != baseline.environment:
        parts.append(f"class {describe(record.environment)}")
    return ", ".join(parts)


def changes(files: Iterable[Path], baselines: Mapping[str, Record]) -> tuple[dict[str, dict[str, float]],
                                                                               dict[str, list[float]]]:
    """Per converged recipe, its accuracy under each change; per change, the largest relative
    change of each loss step over the cases of LOSS_TIERS. ``baselines``: baseline key -> Record."""
    accuracy: dict[str, dict[str, float]] = {}
    losses: dict[str, list[float]] = {}
    for path in files:
        for tier, record in read_records(path):
            baseline = baselines.get(record.baseline_key)
            if baseline is None:
                continue
            label = change_label(record, baseline)
            if not label:
                continue  # the baseline's own stack: no change to measure
            if tier == "converged" and record.accuracy is not None:
                accuracy.setdefault(record.recipe, {})[label] = round(record.accuracy, 4)
            if tier in LOSS_TIERS:
                steps = losses.setdefault(label, [])
                for step, (b, n) in enumerate(zip(baseline.memory_losses, record.memory_losses)):
                    if b is None or n is None or not b:
                        continue
                    moved = abs(n - b) / abs(b)
                    if step < len(steps):
                        steps[step] = max(steps[step], moved)
                    else:
                        steps.append(moved)
    return accuracy, losses


def _round_up(value: float, step: float = 0.0005) -> float:
    return round(math.ceil(round(value / step, 6)) * step, 6)


def document(by_seed: Mapping[str, Mapping[str, float]], mutated: Mapping[str, Mapping[str, float]],
             accuracy_changes: Mapping[str, Mapping[str, float]], loss_changes: Mapping[str, list[float]],
             measured_on: Mapping[str, object], versions: Mapping[str, str | None], seconds: float) -> dict[str, Any]:
    """The tolerance file: every number measured, the tolerances drawn from them, and how."""
    from memclaims.claims import accuracy

    recipes = {}
    for recipe_id, seeds in sorted(by_seed.items()):
        moved = {label: value for label, value in accuracy_changes.get(recipe_id, {}).items()}
        worst = max((abs(v - seeds["123"]) for v in moved.values()), default=0.0)
        recipes[recipe_id] = {"same": SAME_FLOOR, "change": max(CHANGE_FLOOR, _round_up(CHANGE_MARGIN * worst, 0.005)),
                              "by_seed": dict(seeds), "by_change": moved}
    claims = {}
    for pair in accuracy.PAIRS:
        if "cpu" not in pair.tiers:
            continue
        candidate, reference = ("vit-converged/" + "+".join(t) for t in pair.on("cpu"))
        diffs = [round(by_seed[candidate][s] - by_seed[reference][s], 4) for s in by_seed[candidate]]
        tolerance = accuracy.tolerance_from(diffs)
        smallest = round(tolerance + diffs[0], 4)  # how far the candidate may fall at the suite's seed
        name = candidate.split("/", 1)[1]
        drops = {m: round(by_seed[candidate]["123"] - by[name], 4) for m, by in mutated.items() if name in by}
        claims[pair.claim] = {"candidate": candidate, "reference": reference, "differences": diffs,
                              "tolerance": tolerance, "smallest_drop_caught": smallest, "mutation_drops": drops,
                              "mutations_caught": sorted(m for m, d in drops.items() if d > smallest)}
    steps = max((len(v) for v in loss_changes.values()), default=0)
    per_step = [max(LOSS_FLOOR, _round_up(LOSS_MARGIN * max((v[k] for v in loss_changes.values() if k < len(v)),
                                                            default=0.0)))
                for k in range(steps)]
    labels = sorted({label for moved in accuracy_changes.values() for label in moved} | set(loss_changes))
    return {
        "schema": 1,
        "measured_on": dict(measured_on), "versions": dict(versions), "seconds": round(seconds),
        "changes": labels,
        "accuracy": {
            "how": (f"memclaims baselines spread: every converged case (vit-converged, the digits trained to their "
                    f"plateau) at seeds {', '.join(map(str, SEEDS))} on the baseline's CPU class and versions "
                    f"(by_seed), and at seed 123 under each change in 'changes' (by_change: another ATen CPU "
                    f"class, another library release). same = {SAME_FLOOR} (one class and one stack run "
                    f"deterministically); change = max({CHANGE_FLOOR}, {CHANGE_MARGIN:g} x the largest |by_change - "
                    f"by_seed[123]|, rounded up to 0.005); past it a case reruns with the other seeds "
                    f"(memclaims.baselines.noise). Fractions: 0.01 = 1 point."),
            "recipes": recipes,
        },
        "claims": {
            "how": ("each cpu 'keeps accuracy' claim: differences = candidate - reference at each seed (by_seed); "
                    "tolerance = memclaims.claims.accuracy.tolerance_from(differences); smallest_drop_caught = how far the "
                    "candidate may fall at seed 123 before the claim fails; mutation_drops: the candidate at seed "
                    "123 with the learning rate x10 or /10, or with accumulated gradients never zeroed"),
            "mutated_accuracy": {m: dict(v) for m, v in mutated.items()},
            "claims": claims,
        },
        "losses": {
            "how": (f"the loss at each measured step of every {', '.join(LOSS_TIERS)} case, under each change in 'changes', "
                    f"against its committed baseline: by_change = the largest |relative change| per step; "
                    f"per_step = max({LOSS_FLOOR}, {LOSS_MARGIN:g} x the largest over the changes, rounded up to "
                    f"0.0005); compared after a change instead of the tier's {LOSS_FLOOR}"),
            "per_step": per_step,
            "by_change": {label: [round(v, 6) for v in values] for label, values in sorted(loss_changes.items())},
        },
    }


def baselines_by_key(root: Path) -> dict[str, Record]:
    """Every committed cpu baseline of every environment file under ``root``, by baseline key
    (this machine's own environment first wins)."""
    from memclaims.baselines.store import BaselineStore

    store = BaselineStore(root)
    found: dict[str, Record] = {}
    for environment in store.environments():
        if environment.startswith("cpu-"):
            for key, baseline in store.load(environment).items():
                found.setdefault(key, baseline.record)
    return found


def measure_noise(baselines_root: Path, out: Path, classes: Sequence[str], change_files: Sequence[Path],
        seeds: Sequence[int] = SEEDS, reuse: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Measure everything and write the tolerance file ``out`` atomically. ``reuse``: an earlier tolerance
    file of this stack whose seeds and mutations are kept (only the changes are read again)."""
    from memclaims.core.environment import cpu_class_description
    from memclaims.core.record import library_versions

    started = time.time()
    if reuse is not None:
        by_seed = {r: dict(e["by_seed"]) for r, e in reuse["accuracy"]["recipes"].items()}
        mutated = {m: dict(v) for m, v in reuse["claims"]["mutated_accuracy"].items()}
    else:
        by_seed = measure_seeds(seeds)
        mutated = measure_mutations(seeds[0])
    files = list(change_files)
    with tempfile.TemporaryDirectory(prefix="memclaims-spread-") as scratch:
        for cpu_class in classes:
            _progress(f"the worker as ATEN_CPU_CAPABILITY={cpu_class}")
            files.append(measure_class(cpu_class, Path(scratch) / f"{cpu_class}.jsonl"))
        accuracy_changes, loss_changes = changes(files, baselines_by_key(baselines_root))
    data = document(by_seed, mutated, accuracy_changes, loss_changes, cpu_class_description(),
                    library_versions(), time.time() - started)
    write_atomically(out, data)
    return data


def write_atomically(path: Path, data: dict[str, object]) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, path)
