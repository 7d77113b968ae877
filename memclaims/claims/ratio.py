"""A size claim as a ratio of two Records' peaks (``Ratio``), and how the cpu tier derives the ratio it expects at
smoke scale, where the scale changes the published ratio (``Derivation``):

- sim (article scale): the predicted ratio against the published one, within a stated band;
- cpu (smoke scale): against a ratio derived from the exact parameter, gradient and optimizer-state bytes and the
  reference's activations (what the technique changes, by how much), within a stated band;
- gpu (article scale): against the published ratio, within a band for another GPU and software.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memclaims.claims.check import Verdict, audited
from memclaims.claims.figures import (
    as_factor,
    in_gb,
    in_mib,
    peak,
    peak_metric,
    recipe_pair,
    step_counters,
    then,
    within,
)
from memclaims.core import published
from memclaims.core.record import OPTIMIZER_STATE, Record

if TYPE_CHECKING:  # annotations only (the import chain stays short)
    from memclaims.claims.lookup import Lookup, Techniques

PARITY_PEAK_TOLERANCE = 0.01  # Fabric vs plain PyTorch: "same peak within 1 %"
# Sim bands: predicted ratio / published ratio, +-5 %. The sim's `article` profile replays the
# 2023-06 nightly's foreach Adam (memclaims.sim.eras), which puts every row of the chain within
# +-5 % (a claim's own band where it needs another: memclaims.claims.sources.article's SIM_BANDS).
SIM_BAND = (0.95, 1.05)
# gpu at article scale: another GPU generation and torch than the article's A100 + 2023 nightly, +-10 %.
GPU_BAND = (0.90, 1.10)


def scaled(record: Record, factors: dict[str, float]) -> float:
    """The record's training peak with each category of its breakdown scaled (1 where not named)."""
    total = 0.0
    for category, value in record.breakdown.items():
        if category == OPTIMIZER_STATE:  # the step counters stay float32, unless the state goes
            steps = step_counters(record) if factors.get(category, 1.0) else 0
            total += (value - steps) * factors.get(category, 1.0) + steps
        else:
            total += value * factors.get(category, 1.0)
    return total


@dataclass(frozen=True)
class Derivation:
    """How the cpu tier derives a ratio at smoke scale: predicted peak = base record's breakdown
    scaled by ``factors``; expected ratio = predicted / the claim's denominator. ``band`` is on
    measured / expected (``interval`` instead: bounds on the ratio itself)."""

    base: Techniques  # the record whose breakdown is scaled
    factors: dict[str, float]
    band: tuple[float, float]
    why: str
    interval: tuple[dict[str, float], dict[str, float]] | None = None


@dataclass(frozen=True)
class Ratio:
    """A size claim: peak(numerator) / peak(denominator), against the published numbers."""

    claim: str
    numerator: Techniques
    denominator: Techniques
    published_keys: tuple[str, str]  # (numerator, denominator) keys of the claim's numbers
    derivation: Derivation  # what the cpu tier expects at smoke scale
    cpu_numerator: Techniques | None = None
    cpu_denominator: Techniques | None = None
    sim_band: tuple[float, float] = SIM_BAND
    gpu_band: tuple[float, float] = GPU_BAND

    def on(self, tier: str) -> tuple[Techniques, Techniques]:
        if tier == "cpu":
            return self.cpu_numerator or self.numerator, self.cpu_denominator or self.denominator
        return self.numerator, self.denominator

    def published_ratio(self) -> float:
        numbers = published.numbers(self.claim)
        numerator: float = numbers[self.published_keys[0]]
        denominator: float = numbers[self.published_keys[1]]
        return numerator / denominator

    def recipes(self, tier: str) -> tuple[Techniques, ...]:
        num, den = self.on(tier)
        base = self.derivation.base if tier == "cpu" else den
        return tuple(dict.fromkeys((num, den, base)))

    def __call__(self, tier: str, get: Lookup) -> Verdict:
        num_t, den_t = self.on(tier)
        num, den = get(num_t), get(den_t)
        measured = peak(num) / peak(den)
        expected_published = self.published_ratio()
        audit = audited(self.claim, f"{as_factor(measured)}")
        if tier == "cpu":
            return self._derived(get, num, den, measured, audit)
        if tier == "gpu" and num.scale != "article":
            ok = measured < 1.0 if expected_published < 1.0 else abs(measured - 1) <= PARITY_PEAK_TOLERANCE
            return Verdict(ok, f"{tier} at {num.scale} scale: ratio {measured:.3f} of {peak_metric(num)} (published "
                               f"{expected_published:.3f} at article scale); only the direction is asserted at "
                               f"this scale" + then(audit))
        low, high = self.sim_band if tier == "sim" else self.gpu_band
        fidelity = measured / expected_published
        return Verdict(low <= fidelity <= high,
                       f"{recipe_pair(num, den)}: ratio {measured:.3f} of {peak_metric(num)} ({in_gb(num)} / "
                       f"{in_gb(den)}), published {expected_published:.3f}; {measured:.3f} / "
                       f"{expected_published:.3f} = {fidelity:.3f}, band [{low:g}, {high:g}] "
                       f"({within(fidelity, low, high)})" + then(audit))

    def _derived(self, get: Lookup, num: Record, den: Record, measured: float, audit: str) -> Verdict:
        derivation = self.derivation
        base = get(derivation.base)
        if derivation.interval is not None:
            low = scaled(base, derivation.interval[0]) / peak(den)
            high = scaled(base, derivation.interval[1]) / peak(den)
            return Verdict(low <= measured <= high,
                           f"{recipe_pair(num, den)}: ratio {measured:.3f} ({in_mib(peak(num))} / {in_mib(peak(den))}); "
                           f"derived bounds [{low:.3f}, {high:.3f}] ({derivation.why}); {within(measured, low, high)}; "
                           f"published (article scale) {self.published_ratio():.3f}" + then(audit))
        expected = scaled(base, derivation.factors) / peak(den)
        fidelity = measured / expected
        low, high = derivation.band
        return Verdict(low <= fidelity <= high,
                       f"{recipe_pair(num, den)}: ratio {measured:.3f} ({in_mib(peak(num))} / {in_mib(peak(den))}), "
                       f"derived {expected:.3f} ({derivation.why}); {fidelity:.3f} of derived, band [{low:g}, {high:g}] "
                       f"({within(fidelity, low, high)}); published (article scale) {self.published_ratio():.3f}"
                       + then(audit))
