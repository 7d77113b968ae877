"""Where the cpu tier's accuracy tolerances come from: the measured spread over CPU classes and seeds.

A baseline compares the article's seed (123) with the same seed, on this machine's CPU class when
the baseline file has it, else on a sibling class (memclaims.baselines). Within a class a run is
deterministic, so the same-class tolerance is the floor: 2 points (7 of the 359 test images).

Across classes it is not: ATen's default and AVX2 kernels round bf16 differently, and one epoch
of training amplifies that into a different trajectory. Measured at smoke scale, a half-precision
recipe moved by up to 9.7 points between the two classes, as much as a change of seed does (a
seed's standard deviation is 2-7 points), while fp32 recipes did not move at all. So the
cross-class tolerance of a recipe is the largest of

* the floor,
* ``CLASS_FACTOR`` x the largest deviation seen under the classes this machine can run as
  (``ATEN_CPU_CAPABILITY``), and
* for half precision, ``SEED_FACTOR`` x the standard deviation over seeds: on a class no machine
  here has, a bf16 recipe's accuracy is as good as a reseeded run.

What so wide a tolerance cannot see (Adam's learning rate 10x off, broken accumulation) the loss
trajectory catches (memclaims.compare). Everything measured is written to
``baselines/tolerances.json`` beside the tolerances; ``memclaims baselines spread`` measures it
again on any machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLASS_FACTOR = 1.5
SEED_FACTOR = 2.0
TEST_IMAGES = 359  # scikit-learn digits, the smoke scale's seeded 20 % test split
FLOOR = 0.02
HALF_PRECISIONS = ("bf16-mixed", "bf16-true", "16-true", "16-mixed")
NATIVE = "native"


def cpu_recipes() -> list[str]:
    """The cpu tier's single-process ViT recipes that measure accuracy (16-mixed skips on the CPU)."""
    from memclaims import techniques as registry
    from memclaims.recipe import resolve

    ids = []
    for techniques in registry.default_selection():
        recipe = resolve("vit", "smoke", techniques)
        if recipe.precision != "16-mixed" and not recipe.sharded:
            ids.append(recipe.id)
    return ids


def measure_here(recipe_ids: Iterable[str], seeds: Sequence[int]) -> dict[str, dict[str, float | None]]:
    """Accuracy of each recipe at each seed, in this process (this process's CPU class)."""
    from memclaims.measure import measure
    from memclaims.options import RunOptions
    from memclaims.recipe import parse_id

    out: dict[str, dict[str, float | None]] = {}
    for recipe_id in recipe_ids:
        recipe = parse_id(recipe_id)
        out[recipe_id] = {str(seed): measure(recipe, RunOptions(device="cpu", seed=seed))[0].accuracy for seed in seeds}
        print(f"memclaims spread: {recipe_id} {out[recipe_id]}", file=sys.stderr, flush=True)
    return out


def measure_as(cpu_class: str, recipe_ids: Sequence[str], seeds: Sequence[int]) -> dict[str, Any]:
    """Run :func:`measure_here` in a fresh interpreter forced to ``cpu_class`` (ATen reads the
    variable once, at import); ``native`` leaves the machine's own class."""
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if cpu_class != NATIVE:
        env["ATEN_CPU_CAPABILITY"] = cpu_class
    command = [sys.executable, "-m", "memclaims.spread", "--seeds", ",".join(map(str, seeds)), *recipe_ids]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, check=True, text=True)
    return dict(json.loads(done.stdout))


@dataclass(frozen=True)
class Spread:
    recipe: str
    precision: str
    baseline_accuracy: float | None  # the baseline class, seed 123
    by_class: dict[str, float | None]  # seed 123 under each class
    by_seed: dict[str, float | None]  # the baseline class under each seed

    @property
    def class_deviation(self) -> float:
        values = [v for v in self.by_class.values() if v is not None]
        if self.baseline_accuracy is None or not values:
            return 0.0
        return max(abs(v - self.baseline_accuracy) for v in values)

    @property
    def seed_deviation(self) -> float:
        values = [v for v in self.by_seed.values() if v is not None]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    @property
    def tolerance(self) -> float:
        """Against a baseline of this machine's own class: runs are deterministic there."""
        return FLOOR

    @property
    def cross_class_tolerance(self) -> float:
        """Against a baseline of a sibling class."""
        reseeded = SEED_FACTOR * self.seed_deviation if self.precision in HALF_PRECISIONS else 0.0
        return round(max(FLOOR, CLASS_FACTOR * self.class_deviation, reseeded), 4)


def tolerances_document(spreads: Iterable[Spread], classes: Sequence[str], seeds: Sequence[int],
                        baseline_class: str) -> dict[str, Any]:
    from memclaims.environment import cpu_class_description

    return {
        "schema": 1,
        "accuracy": {
            "how": (f"memclaims baselines spread: each cpu recipe at seed 123 under the CPU classes "
                    f"{', '.join(classes)} (ATEN_CPU_CAPABILITY) and at seeds 123, {', '.join(map(str, seeds))} "
                    f"under the baseline class {baseline_class}. tolerance (same class; runs are "
                    f"deterministic) = {FLOOR}; cross_class_tolerance = max({FLOOR}, {CLASS_FACTOR:g} x the "
                    f"largest deviation across classes, and for half precision {SEED_FACTOR:g} x the standard "
                    f"deviation over seeds); fractions (0.02 = 2 points); see memclaims/spread.py"),
            "measured_on": cpu_class_description(),
            "recipes": {s.recipe: {"tolerance": s.tolerance, "cross_class_tolerance": s.cross_class_tolerance,
                                   "baseline_accuracy": s.baseline_accuracy,
                                   "by_class": s.by_class, "by_seed": s.by_seed}
                        for s in sorted(spreads, key=lambda s: s.recipe)},
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The worker of :func:`measure_as`: prints ``{recipe: {seed: accuracy}}`` as JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m memclaims.spread")
    parser.add_argument("--seeds", required=True)
    parser.add_argument("recipes", nargs="+")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(json.dumps(measure_here(args.recipes, seeds)))
    return 0


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, path)


if __name__ == "__main__":
    sys.exit(main())
