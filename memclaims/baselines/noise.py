"""How far a numerics change moves a number that is not memory, measured, and the verdicts built on it.

Within one CPU class and one set of library versions a cpu-tier run is deterministic: any change of
accuracy or of the loss trajectory is a change of training. Across a library release or another
CPU class the arithmetic rounds differently and training amplifies it: the loss at step 4 of a
smoke run moved by up to 0.23 % between torch 2.9.1 and 2.14.1, and a run short of its plateau
moved its accuracy by points. That movement is noise, not a regression, so it is measured
(``memclaims baselines spread``: the converged cases at several seeds and under other CPU
classes, and the Records of real releases that ``memclaims upgrade`` or ``python -m
memclaims.report.candidate`` measured) and stored with how it was obtained in the tolerance file; the
verdicts here read it:

- accuracy (``converged`` scale only): against a baseline of the same class and versions, the
  ``same`` tolerance; after a change, the ``change`` tolerance, and past it the case reruns with
  the stored extra seeds: it fails only if the mean over the seeds dropped beyond what seeds
  differ by (``SEED_MEAN_SIGMAS`` standard deviations of a difference of two means);
- the loss trajectory: after a change, a tolerance per step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memclaims.baselines.compare import ACCURACY, INFO, OK, REGRESSION, Comparison, MetricResult, compare
from memclaims.core.record import VERSIONED_PACKAGES, Record

# A difference of two means of n seeds each has a standard deviation of sd x sqrt(2 / n) when a
# change acts as a reseed; 3 of them: a real fault (learning rate /10: 6-10 points) is far beyond.
SEED_MEAN_SIGMAS = 3.0
SUITE_SEED = "123"  # the article's seed: the one every baseline is measured at


@dataclass(frozen=True)
class AccuracyNoise:
    """One converged recipe's measured accuracy noise (fractions: 0.01 = 1 point)."""

    recipe: str
    same: float  # against a baseline of this machine's class and these library versions
    change: float  # against a baseline of another CPU class or other library versions
    by_seed: dict[str, float] = field(default_factory=dict)  # on the baseline's class and versions
    by_change: dict[str, float] = field(default_factory=dict)  # the suite's seed, per class or release

    @property
    def extra_seeds(self) -> list[int]:
        return sorted(int(s) for s in self.by_seed if s != SUITE_SEED)

    @property
    def seed_sd(self) -> float:
        values = list(self.by_seed.values())
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def seeds_allowed(self) -> float:
        """How far the mean over the stored seeds may drop before it is a fault, not a reseed."""
        return SEED_MEAN_SIGMAS * self.seed_sd * math.sqrt(2 / max(1, len(self.by_seed)))

    @classmethod
    def from_json(cls, recipe: str, raw: Mapping[str, Any]) -> AccuracyNoise:
        return cls(recipe=recipe, same=float(raw["same"]), change=float(raw["change"]),
                   by_seed={str(k): float(v) for k, v in raw.get("by_seed", {}).items()},
                   by_change={str(k): float(v) for k, v in raw.get("by_change", {}).items()})


@dataclass(frozen=True)
class Noise:
    """The tolerance file's measured noise: per converged recipe, and per step of a loss trajectory."""

    accuracy: dict[str, AccuracyNoise] = field(default_factory=dict)
    loss_per_step: list[float] = field(default_factory=list)
    how: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Noise:
        accuracy = data.get("accuracy", {})
        losses = data.get("losses", {})
        return cls(accuracy={r: AccuracyNoise.from_json(r, v) for r, v in accuracy.get("recipes", {}).items()},
                   loss_per_step=[float(t) for t in losses.get("per_step", [])],
                   how={k: str(v["how"]) for k, v in (("accuracy", accuracy), ("losses", losses)) if "how" in v})


def changed(baseline: Record, record: Record, baseline_environment: str, environment: str) -> str:
    """What changed between a baseline and a run that moves their arithmetic ("" when nothing did):
    another CPU class or GPU, or another release of a library the suite tests."""
    parts = [] if baseline_environment == environment else [f"{baseline_environment} -> {environment}"]
    parts += [f"{p} {baseline.versions.get(p)} -> {record.versions.get(p)}" for p in VERSIONED_PACKAGES
              if baseline.versions.get(p) != record.versions.get(p)]
    return ", ".join(parts)


def _points(value: float) -> str:
    return f"{value * 100:.2f} points"


def accuracy_verdict(result: MetricResult, noise: AccuracyNoise, rerun: Callable[[int], float] | None,
                     what_changed: str) -> MetricResult:
    """A converged accuracy's verdict: within its tolerance (``same``, or ``change`` after a change of
    class or library) it stands; past it one run cannot tell a fault from a reseed-like change, so the
    stored extra seeds decide (rerun each here, compare the means with the stored ones). Reruns also
    after no recorded change: two machines of one class may still round differently."""
    tolerance = noise.change if what_changed else noise.same
    why = (f"after a change ({what_changed}): tolerance {_points(noise.change)}, the noise measured for a library "
           f"release or CPU class change" if what_changed else
           f"same CPU class and libraries as the baseline: tolerance {_points(noise.same)}")
    if result.verdict != REGRESSION or result.now is None or result.baseline is None:
        return MetricResult(ACCURACY, result.baseline, result.now, result.change_pct, tolerance, result.verdict, why)
    seeds = noise.extra_seeds
    if rerun is None or not seeds:
        return MetricResult(ACCURACY, result.baseline, result.now, result.change_pct, tolerance, REGRESSION,
                            why + "; no extra seeds to rerun with")
    now = {SUITE_SEED: result.now, **{str(s): rerun(s) for s in seeds}}
    before = {s: noise.by_seed[s] for s in now if s in noise.by_seed}
    mean_now, mean_before = statistics.mean(now.values()), statistics.mean(before.values())
    allowed = noise.seeds_allowed()
    verdict = REGRESSION if mean_before - mean_now > allowed else OK
    detail = (f"{why}; one run cannot tell a fault from a reseed: reran with {len(seeds)} more seeds "
              f"({', '.join(map(str, seeds))}): mean over {len(now)} seeds {mean_now * 100:.2f} % vs "
              f"{mean_before * 100:.2f} % measured on the baseline's stack, drop {_points(mean_before - mean_now)}, "
              f"allowed {_points(allowed)} ({SEED_MEAN_SIGMAS:g} x the seed standard deviation "
              f"{_points(noise.seed_sd)} x sqrt(2/{len(now)}))")
    return MetricResult(ACCURACY, mean_before, mean_now, None, allowed, verdict, detail)


def judge(record: Record, baseline: Record, baseline_environment: str, noise: Noise, *,
          overrides: Mapping[str, float | None] | None = None, case_id: str | None = None,
          time_threshold_pct: float | None = None, strict: bool = False,
          rerun: Callable[[int], float] | None = None) -> Comparison:
    """``record`` against its ``baseline`` (memclaims.baselines.compare), with the measured noise where the run's
    arithmetic changed since the baseline and the seeds deciding a converged accuracy past its
    tolerance. Every verdict on a baseline goes through here: the pytest cases and ``memclaims upgrade``."""
    from memclaims.core.environment import environment_id

    what_changed = changed(baseline, record, baseline_environment, environment_id(record))
    accuracy_noise = noise.accuracy.get(record.recipe) if record.device == "cpu" else None
    tolerances: dict[str, float | None] = {}
    if accuracy_noise is not None:
        tolerances[ACCURACY] = accuracy_noise.change if what_changed else accuracy_noise.same
    tolerances.update(overrides or {})
    comparison = compare(record, baseline, tolerances, case_id=case_id, time_threshold_pct=time_threshold_pct,
                         strict=strict, environment=baseline_environment,
                         loss_tolerances=noise.loss_per_step if what_changed and noise.loss_per_step else None)
    if accuracy_noise is not None:
        comparison.results = [accuracy_verdict(r, accuracy_noise, rerun, what_changed)
                              if r.metric == ACCURACY and r.verdict != INFO else r for r in comparison.results]
    return comparison
