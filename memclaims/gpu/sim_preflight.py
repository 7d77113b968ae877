"""The gpu tier's preflight: its claims at its own scales on simulated A100, H100 and H200 cards.

A design error of the gpu tier (a scale too small for the allocator's 2 MiB segments to show a
difference, a case that does not fit a card) must show on a machine without a GPU. This module
simulates the recipes the gpu tier's claims compare, at each scale the gpu tier runs, on each
target profile, and evaluates the claims on those Records.

What the simulator cannot see is said, not guessed: claims about values (NaN) are "not simulated";
claims that also compare accuracy are evaluated on their memory relation only (both Records get
the same placeholder accuracy, and the detail says so); recipes the sim cannot replay (8-bit
optimizers, sharding) leave their claim "not simulated" with the sim's reason.

Cost: one simulation per (recipe, scale, simulated device). A case must fit its card without the
allocator freeing its cache and retrying (``RunOptions(limit_bytes=...)`` on the sim): a case that fits only
so reserves up to the card's limit whatever the claim, and runs slower. So profiles that differ
only in capacity share one simulation: capacity changes no allocation, it only decides "fits". With
the gpu tier's deterministic cuBLAS setting (32 MiB workspaces everywhere) a100, h100 and h200 all
share one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from memclaims.claims.catalogue import CLAIMS, Claim
from memclaims.claims.lookup import Key, Lookup, load_only, options_for, recipe_of
from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.recipes.run_options import RunOptions
from memclaims.run import refuse, run_recipe
from memclaims.sim.profiles import GPU_TIER_PROFILES, Profile
from memclaims.sim.profiles import profile as find_profile
from memclaims.workloads.registry import gpu_tier_scale

HOLDS, FAILS, NOT_SIMULATED = "holds", "FAILS", "not simulated"
GPU_TIER_SCALES = ("smoke", "article")  # what --memclaims-gpu-scale accepts
# Placeholder accuracy for claims that also compare accuracy: equal on both sides, so only their
# memory relation decides the verdict.
_SAME_ACCURACY = 1.0


@dataclass(frozen=True)
class Row:
    claim: str
    profile: str
    scale: str  # the recipe scale that ran (gpusmoke, article)
    verdict: str  # HOLDS, FAILS or NOT_SIMULATED
    detail: str


# Claim kinds whose values a simulated run has: bytes, and ratios and counts of them.
SIM_KINDS = ("memory", "ratio", "count")


def gpu_tier_claims(claims: Iterable[Claim] | None = None) -> list[Claim]:
    """The claims whose gpu-tier check lives in memclaims.claims.catalogue (suite/cases/test_claims.py runs them)."""
    return [c for c in (CLAIMS if claims is None else claims)
            if c.checks.get("gpu") == "claims" and c.check is not None and "gpu" in c.check.tiers]


def recipes(claim: Claim) -> tuple[Key, ...]:
    """What the claim's gpu-tier check looks up (memclaims.claims.lookup)."""
    return claim.check.recipes_on("gpu") if claim.check else ()


def _value_reason(claim: Claim) -> str | None:
    """Why the sim cannot decide ``claim`` at all (it sees no such values), or None."""
    if claim.kind not in SIM_KINDS:
        return f"a {claim.kind} claim: a simulated run has no {claim.kind} to compare"
    if not recipes(claim):
        return "checked on the device itself, not on a run"
    return None


def _sim_key(chosen: Profile) -> tuple[object, ...]:
    """What decides a simulation's allocations: everything of a profile but its name and capacity."""
    return (tuple(sorted(chosen.attention.items())), chosen.cublas_workspace_bytes,
            chosen.flash_backward_scratch, chosen.allocator)


class Preflight:
    """Simulations shared across claims and profiles; ``rows`` evaluates every claim."""

    def __init__(self, workload: str = "vit", memory_steps: int | None = None) -> None:
        self.workload = workload
        self.memory_steps = memory_steps
        self._records: dict[tuple[object, ...], Record | UsageError] = {}
        self.simulations = 0

    def record(self, wanted: Key, scale: str, profile_name: str) -> Record:
        """The simulated Record; raises UsageError when the sim cannot replay the recipe."""
        chosen = find_profile(profile_name)
        recipe = recipe_of(wanted, self.workload, scale)
        key = (recipe.id, load_only(wanted), _sim_key(chosen))
        if key not in self._records:
            options = options_for(wanted, RunOptions(device="sim", profile=chosen.name, memory_steps=self.memory_steps))
            try:
                refuse(recipe, options)
                self._records[key] = run_recipe(recipe, options)[0]
                self.simulations += 1
            except UsageError as reason:
                self._records[key] = reason
        found = self._records[key]
        if isinstance(found, UsageError):
            raise found
        return found

    def evaluate(self, claim: Claim, requested_scale: str, profile_name: str, *, map_scale: bool = True) -> Row:
        """``requested_scale`` as --memclaims-gpu-scale takes it; ``map_scale=False``: a recipe scale as is."""
        scale = gpu_tier_scale(claim.workload, requested_scale) if map_scale else requested_scale
        reason = _value_reason(claim)
        if reason:
            return Row(claim.name, profile_name, scale, NOT_SIMULATED, reason)
        records: dict[Key, Record] = {}
        try:
            for wanted in recipes(claim):
                records[wanted] = self.record(wanted, scale, profile_name)
        except UsageError as error:
            return Row(claim.name, profile_name, scale, NOT_SIMULATED, str(error))
        chosen = find_profile(profile_name)
        # A simulated Record always carries the never-reset reserved peak (sim.replay sets it).
        reserved = {r.recipe: r.peak_reserved_total_bytes or 0 for r in records.values()}
        card = chosen.total_memory_bytes or 0  # 0: the profile names no card size, nothing is too big
        too_big = [r for r in records.values() if card and reserved[r.recipe] > card]
        if too_big:
            detail = "; ".join(f"{r.recipe} needs {reserved[r.recipe] / 2**30:.2f} GiB reserved, the "
                               f"card has {card / 2**30:.2f} GiB" for r in too_big)
            return Row(claim.name, profile_name, scale, FAILS, f"does not fit: {detail}")
        if claim.needs_accuracy:
            records = {k: dataclasses.replace(r, accuracy=_SAME_ACCURACY) for k, r in records.items()}
        assert claim.check is not None  # gpu_tier_claims has only claims with a check
        verdict = claim.check.run("gpu", Lookup(records.__getitem__))
        detail = verdict.detail
        if claim.needs_accuracy:
            detail = f"memory relation only (the sim has no accuracy): {detail}"
        return Row(claim.name, profile_name, scale, HOLDS if verdict.passed else FAILS, detail)

    def rows(self, scales: Iterable[str] = GPU_TIER_SCALES, profiles: Iterable[str] = GPU_TIER_PROFILES,
             claims: Iterable[Claim] | None = None) -> list[Row]:
        chosen = gpu_tier_claims() if claims is None else list(claims)
        return [self.evaluate(c, s, p) for s in scales for p in profiles for c in chosen
                if c.workload == self.workload]


def table(rows: list[Row]) -> str:
    """Markdown: one line per claim, one column per (profile, scale)."""
    columns = list(dict.fromkeys((r.profile, r.scale) for r in rows))
    cell = {(r.claim, r.profile, r.scale): r.verdict for r in rows}
    lines = ["| claim | " + " | ".join(f"{p} {s}" for p, s in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for claim in dict.fromkeys(r.claim for r in rows):
        lines.append(f"| {claim} | " + " | ".join(cell.get((claim, p, s), "") for p, s in columns) + " |")
    return "\n".join(lines)
