"""Where the cpu tier's accuracy tolerances come from: the measured spread over CPU classes and seeds.

A baseline compares the article's seed (123) on one machine with the same seed on another. Two
CPU capability classes (ATen's AVX2 and AVX-512 kernels, bf16 hardware or not) round differently,
and one epoch of training amplifies a rounding difference into a few test images. So each
recipe's accuracy tolerance is the larger of

* its precision family's floor: 2 points for fp32 (the tolerance that held for every fp32 case on
  a second x86_64 machine, issue 11) and ``HALF_FLOOR`` for half-precision recipes (2 x the 3.62
  points that ``bf16-true+small-batch+grad-accum`` moved on a machine without AVX512-BF16), and
* ``CLASS_FACTOR`` x the largest deviation seen under the classes this machine can run as
  (``ATEN_CPU_CAPABILITY``).

Seeds are measured and stored beside, not used: a seed changes the initialisation and the data
order, and moved accuracy by up to 18 points at smoke scale, far more than a CPU class does; a
tolerance that absorbed it would absorb real regressions too. What a tolerance this wide cannot
see (Adam's learning rate 10x off, broken accumulation) the loss trajectory catches (compare.py).
The result is written to ``baselines/tolerances.json`` with the raw accuracies, and
``memclaims baselines spread`` measures it again on any machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

CLASS_FACTOR = 1.5
TEST_IMAGES = 359  # scikit-learn digits, the smoke scale's seeded 20 % test split
FLOOR = 0.02
HALF_FLOOR = 2 * 13 / TEST_IMAGES  # 13 test images = the 3.62 points seen across machines
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
    from memclaims.recipe import parse_id
    from memclaims.runner import RunOptions, run

    out: dict[str, dict[str, float | None]] = {}
    for recipe_id in recipe_ids:
        recipe = parse_id(recipe_id)
        out[recipe_id] = {str(seed): run(recipe, RunOptions(device="cpu", seed=seed)).accuracy for seed in seeds}
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
        floor = HALF_FLOOR if self.precision in HALF_PRECISIONS else FLOOR
        return round(max(floor, CLASS_FACTOR * self.class_deviation), 4)


def tolerances_document(spreads: Iterable[Spread], classes: Sequence[str], seeds: Sequence[int],
                        baseline_class: str) -> dict[str, Any]:
    from memclaims.environment import cpu_class_description

    return {
        "schema": 1,
        "accuracy": {
            "how": (f"memclaims baselines spread: each cpu recipe at seed 123 under the CPU classes "
                    f"{', '.join(classes)} (ATEN_CPU_CAPABILITY) and at seeds {', '.join(map(str, seeds))} "
                    f"under the baseline class {baseline_class}; tolerance = max(floor, {CLASS_FACTOR:g} x "
                    f"largest deviation across classes), floor {FLOOR} for fp32 and {HALF_FLOOR:.4f} "
                    f"(2 x 13 of {TEST_IMAGES} test images, the deviation seen across machines) for half "
                    f"precision; seeds are reported, not used (see memclaims/spread.py); fractions "
                    f"(0.02 = 2 points)"),
            "measured_on": cpu_class_description(),
            "recipes": {s.recipe: {"tolerance": s.tolerance, "baseline_accuracy": s.baseline_accuracy,
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
