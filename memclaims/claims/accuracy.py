"""The article's "keeps accuracy" claims, the converged cases they compare, and the mutations their
tolerances must catch.

Each claim compares a recipe with the one it changes, trained from the same seed to its plateau
(the vit workload's ``converged`` scale). One seed is exact run to run on the CPU, so a tolerance
is not for noise between repeats: it is for how much a harmless change of arithmetic (a library
upgrade, another CPU) moves it. That is measured as the spread over seeds of the same-seed
difference (candidate - reference), with the mutations a tolerance must catch (learning rate 10x
off, gradient accumulation that never zeroes): ``memclaims baselines spread`` (memclaims.report.spread)
writes it into the tolerance file's ``claims`` section, which the claims read.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memclaims.core import packaged
from memclaims.techniques.technique_registry import ARTICLE_CHAIN


@dataclass(frozen=True)
class AccuracyPair:
    claim: str  # the catalogue id of the claim in published.json
    candidate: tuple[str, ...]
    reference: tuple[str, ...]
    # What the cpu tier runs instead, at the converged scale: Lightning has no float16 AMP on the
    # CPU (16-mixed runs as bf16-mixed), and the chain's steps 04-06 are checked one technique at a
    # time against the fp32 reference (bf16 costs 4-5x on a CPU without bf16 instructions, and the
    # chain's micro-batches of 2 examples would cost minutes); bf16-true has its own claim.
    cpu_candidate: tuple[str, ...] | None = None
    cpu_reference: tuple[str, ...] | None = None
    tiers: tuple[str, ...] = ("cpu", "gpu")

    def on(self, tier: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if tier == "cpu":
            return self.cpu_candidate or self.candidate, self.cpu_reference or self.reference
        return self.candidate, self.reference


_, _, CHAIN_04, CHAIN_05, CHAIN_06 = ARTICLE_CHAIN  # the chain's steps 04, 05 and 06

PAIRS: tuple[AccuracyPair, ...] = (
    AccuracyPair("fabric-accuracy", ("fabric",), ("pytorch",)),
    AccuracyPair("16-mixed-accuracy", ("16-mixed",), ("fabric",), cpu_candidate=("bf16-mixed",)),
    AccuracyPair("bf16-true-accuracy", ("bf16-true",), ("fabric",)),
    AccuracyPair("small-batch-accuracy", CHAIN_04, ("bf16-true",), ("small-batch",), ("fabric",)),
    AccuracyPair("grad-accum-accuracy", CHAIN_05, CHAIN_04, ("grad-accum",), ("fabric",)),
    AccuracyPair("sgd-accuracy", CHAIN_06, CHAIN_05, ("sgd",), ("fabric",)),
    AccuracyPair("init-module-accuracy", ("bf16-true", "init-module"), ("bf16-true",)),
    AccuracyPair("overall-accuracy", CHAIN_06, ("fabric",), tiers=("gpu",)),
)
# The converged scale's cases (suite/cases/test_accuracy.py): every recipe a cpu accuracy claim compares,
# and the optimizers whose arithmetic a release could break without moving a byte.
CONVERGED_CASES: tuple[tuple[str, ...], ...] = tuple(dict.fromkeys(
    [t for p in PAIRS if "cpu" in p.tiers for t in p.on("cpu")] + [("adamw",), ("adam8bit",), ("adafactor",)]))
BY_CLAIM = {p.claim: p for p in PAIRS}


@contextmanager
def learning_rate_times(factor: float) -> Iterator[None]:
    """Every recipe's learning rate multiplied by ``factor`` (a mutation a claim must catch)."""
    from unittest import mock

    from memclaims.recipes.recipe import Recipe

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


def tolerance_from(differences: list[float], floor: float = 0.01, step: float = 0.005, margin: float = 1.25) -> float:
    """The largest same-seed drop seen over the seeds, times ``margin``, rounded up to ``step``,
    never under ``floor``.

    ``margin``: the suite's seed is itself one draw; where it is the worst of the measured seeds,
    an upgrade that perturbs its trajectory is another draw that may exceed the worst of five.
    ``floor``: 1 point, so that a change of a few test images (one is 0.28 points of the digits
    test set) never fails a claim whose seeds showed no drop at all.
    """
    worst_drop = max(0.0, -min(differences)) * margin
    return round(max(floor, math.ceil(round(worst_drop / step, 6)) * step), 4)


def load() -> dict[str, Any]:
    """The claims' measured spread: the ``claims`` section of the packaged tolerance file (memclaims.report.spread)."""
    from memclaims.baselines.store import read_tolerances

    claims: dict[str, object] = read_tolerances(packaged.resource(packaged.TOLERANCES))["claims"]
    return claims
