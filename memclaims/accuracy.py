"""The article's "keeps accuracy" claims at smoke scale, and where their tolerances come from.

Each claim compares a recipe with the one it changes, trained from the same seed. One seed is
exact run to run on the CPU, so a tolerance is not for noise between repeats: it is for how much a
harmless change of arithmetic (a library upgrade, another CPU) moves a 1-epoch smoke accuracy.
That is measured as the spread over seeds of the same-seed difference (candidate - reference):
``python -m memclaims.accuracy`` trains every pair at several seeds, plus the mutations a
tolerance must catch (learning rate 10x off, gradient accumulation that never zeroes), and writes
``baselines/accuracy_spread.json``. The claims read their tolerances from that file.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from memclaims.techniques import ARTICLE_CHAIN

SPREAD_FILE = Path(__file__).resolve().parent.parent / "baselines" / "accuracy_spread.json"
SEEDS = (123, 1, 2, 3, 4)  # 123 is the article's (and the suite's); the others measure the spread


@dataclass(frozen=True)
class AccuracyPair:
    claim: str  # the catalogue id of the claim in baselines/published.json
    candidate: tuple[str, ...]
    reference: tuple[str, ...]
    # What the CPU runs instead of a technique it cannot (Lightning: no float16 AMP on the CPU).
    cpu_candidate: tuple[str, ...] | None = None
    cpu_reference: tuple[str, ...] | None = None

    def on(self, tier: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if tier == "cpu":
            return self.cpu_candidate or self.candidate, self.cpu_reference or self.reference
        return self.candidate, self.reference


_, _, CHAIN_04, CHAIN_05, CHAIN_06 = ARTICLE_CHAIN  # the chain's steps 04, 05 and 06

PAIRS: tuple[AccuracyPair, ...] = (
    AccuracyPair("fabric-accuracy", ("fabric",), ("pytorch",)),
    AccuracyPair("16-mixed-accuracy", ("16-mixed",), ("fabric",), cpu_candidate=("bf16-mixed",)),
    AccuracyPair("bf16-true-accuracy", ("bf16-true",), ("fabric",)),
    AccuracyPair("small-batch-accuracy", CHAIN_04, ("bf16-true",)),
    AccuracyPair("grad-accum-accuracy", CHAIN_05, CHAIN_04),
    AccuracyPair("sgd-accuracy", CHAIN_06, CHAIN_05),
    AccuracyPair("init-module-accuracy", ("bf16-true", "init-module"), ("bf16-true",)),
    AccuracyPair("overall-accuracy", CHAIN_06, ("fabric",)),
)
BY_CLAIM = {p.claim: p for p in PAIRS}


@contextmanager
def learning_rate_times(factor: float) -> Iterator[None]:
    """Every recipe's learning rate multiplied by ``factor`` (a mutation a claim must catch)."""
    from unittest import mock

    from memclaims.recipe import Recipe

    # The property object itself (Recipe.learning_rate would be its value to mypy), and its getter.
    original: property = vars(Recipe)["learning_rate"]
    getter = original.fget
    assert getter is not None
    # patch.object swaps the class attribute and restores it on the way out (mypy reads an assignment
    # to a method or property as a mistake; here it is the mutation).
    with mock.patch.object(Recipe, "learning_rate", property(lambda self: factor * getter(self))):
        yield


@contextmanager
def accumulation_never_zeroed() -> Iterator[None]:
    """Broken accumulation: gradients pile up over every step (zero_grad after a step is lost)."""
    from unittest import mock

    import torch

    with mock.patch.object(torch.optim.Optimizer, "zero_grad", lambda self, set_to_none=True: None):
        yield


MUTATIONS = {"lr-x10": lambda: learning_rate_times(10.0), "lr-div10": lambda: learning_rate_times(0.1),
             "accumulation-never-zeroed": accumulation_never_zeroed}


def smoke_accuracy(techniques: tuple[str, ...], seed: int) -> float:
    from memclaims.measure import measure
    from memclaims.options import RunOptions
    from memclaims.recipe import resolve

    record = measure(resolve("vit", "smoke", techniques), RunOptions(device="cpu", seed=seed))[0]
    assert record.accuracy is not None
    return record.accuracy


def tolerance_from(differences: list[float], floor: float = 0.02, step: float = 0.005, margin: float = 1.25) -> float:
    """The largest same-seed drop seen over the seeds, times ``margin``, rounded up to ``step``,
    never under ``floor``.

    ``margin``: the suite's seed is itself one draw; where it is the worst of the measured seeds,
    an upgrade that perturbs its trajectory is another draw that may exceed the worst of five.
    1.25 is the largest margin that still fails every claim under a learning rate 10x too high
    (init-module-accuracy: lr x10 costs 0.050, caught from 0.0495). ``floor``: 2 points, so that a
    change of a few test images (one is 0.28 points of the digits test set) never fails a claim
    whose seeds showed no drop at all.
    """
    worst_drop = max(0.0, -min(differences)) * margin
    return round(max(floor, math.ceil(round(worst_drop / step, 6)) * step), 4)


class Measured(TypedDict):
    """What ``measure`` trained: accuracy by recipe then seed, and by mutation then candidate."""

    seeds: list[int]
    accuracy: dict[str, dict[str, float]]
    mutated_accuracy: dict[str, dict[str, float]]
    seconds: float


class ClaimSpread(TypedDict):
    """One claim's same-seed differences and the tolerance drawn from them (``summarise``)."""

    candidate: str
    reference: str
    differences: list[float]
    tolerance: float
    smallest_drop_caught: float
    mutation_drops: dict[str, float]
    mutations_caught: list[str]


class Spread(Measured):
    """``summarise``'s result: the measurement, each claim's spread, and how it was made."""

    claims: dict[str, ClaimSpread]
    how: str


class SpreadFile(Spread, total=False):
    """baselines/accuracy_spread.json: a Spread and the library versions it was measured with."""

    versions: dict[str, str | None]


def measure(seeds: tuple[int, ...] = SEEDS) -> Measured:
    """Train every pair's recipes at every seed, and each candidate under each mutation at the first."""
    started = time.time()
    recipes = sorted({t for p in PAIRS for t in p.on("cpu")})
    accuracy = {"+".join(t): {str(s): round(smoke_accuracy(t, s), 4) for s in seeds} for t in recipes}
    mutated: dict[str, dict[str, float]] = {}
    for name, make in MUTATIONS.items():
        mutated[name] = {}
        for candidate in sorted({p.on("cpu")[0] for p in PAIRS}):
            if name == "accumulation-never-zeroed" and "grad-accum" not in candidate:
                continue
            with make():
                mutated[name]["+".join(candidate)] = round(smoke_accuracy(candidate, seeds[0]), 4)
    return {"seeds": list(seeds), "accuracy": accuracy, "mutated_accuracy": mutated,
            "seconds": round(time.time() - started, 1)}


def summarise(raw: Measured) -> Spread:
    """Per claim: same-seed differences, tolerance, and the smallest drop the suite's seed catches."""
    seeds = [str(s) for s in raw["seeds"]]
    first = seeds[0]
    accuracy, mutated = raw["accuracy"], raw["mutated_accuracy"]
    claims: dict[str, ClaimSpread] = {}
    for pair in PAIRS:
        candidate, reference = ("+".join(t) for t in pair.on("cpu"))
        diffs = [round(accuracy[candidate][s] - accuracy[reference][s], 4) for s in seeds]
        tolerance = tolerance_from(diffs)
        # The check fails when reference - candidate > tolerance: at the suite's seed, a drop of the
        # candidate by more than tolerance + (candidate - reference) is caught.
        smallest = round(tolerance + diffs[0], 4)
        drops = {name: round(accuracy[candidate][first] - by[candidate], 4)
                 for name, by in mutated.items() if candidate in by}
        claims[pair.claim] = {"candidate": candidate, "reference": reference, "differences": diffs,
                              "tolerance": tolerance, "smallest_drop_caught": smallest,
                              "mutation_drops": drops,
                              "mutations_caught": sorted(n for n, d in drops.items() if d > smallest)}
    return {**raw, "claims": claims, "how": (
        "python -m memclaims.accuracy: each recipe trained on the CPU at vit smoke scale (RunOptions "
        "defaults: the memory steps, then 1 accuracy epoch of the offline digits set; 359 test images), "
        "once per seed; difference = candidate - reference at the same seed; tolerance = 1.25 x the "
        "largest drop over the seeds rounded up to 0.005, at least 0.02; smallest_drop_caught = how far the "
        "candidate may fall at the suite's seed (the first) before the claim fails; mutations: the "
        "candidate at the first seed with the learning rate x10 or /10, or with accumulated gradients "
        "never zeroed")}


def load(path: Path = SPREAD_FILE) -> SpreadFile:
    spread: SpreadFile = json.loads(path.read_text())
    return spread


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m memclaims.accuracy", description=__doc__)
    parser.add_argument("--out", type=Path, default=SPREAD_FILE)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = parser.parse_args()
    import memclaims.record

    result: SpreadFile = {**summarise(measure(tuple(args.seeds))), "versions": memclaims.record.library_versions()}
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result["claims"], indent=2))


if __name__ == "__main__":
    main()
