"""Measure the tiers a release is judged on, in this interpreter: the worker of ``memclaims upgrade``.

``python -m memclaims.report.candidate --out FILE`` runs, with whatever torch, Lightning, transformers and
bitsandbytes this interpreter has, every case the comparison needs and appends one JSON line per
case to FILE: ``{"tier": ..., "record": {...}}``, or ``{"tier": ..., "recipe": ..., "skipped": why}``
for a case this machine cannot run, or ``"error"`` for one that failed. A line already in FILE is
not measured again, so an interrupted run resumes where it stopped.

The tiers (``TIERS``): ``cpu`` (the technique matrix at smoke scale, exact bytes, accuracy
reported), ``converged`` (the accuracy cases, trained to their plateau), ``sim`` (the matrix at
article scale on the ``article`` profile) and ``sim-current`` (the article's chain on the
``current`` profile: what the installed torch itself allocates) and ``dist`` (the sharded
recipes on 2 CPU ranks over gloo, one Record per rank, as suite/cases/test_sharding.py runs them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from memclaims.claims import accuracy
from memclaims.core import offline, progress
from memclaims.core.errors import MemclaimsError
from memclaims.core.names import CONVERGED
from memclaims.recipes import requirements
from memclaims.recipes.recipe import Recipe, for_workload, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import case_needs
from memclaims.run import needs as run_needs
from memclaims.techniques import technique_registry as registry

TIERS = ("cpu", "converged", "dist", "sim", "sim-current")
CHAIN = registry.CHAIN
# The multi-device smoke recipes with per-rank baselines, run in one process group of DIST_RANKS: the
# article's FSDP steps, the ViT-H/14 series' CPU-runnable bars (16-mixed), and BigBird's root-only
# wrap (its "after" script shards without an auto-wrap policy).
DIST_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vit", ("fsdp",)), ("vit", ("fsdp", "activation-checkpointing")), ("vit-h14", ("16-mixed", "fsdp")),
    ("vit-h14", ("16-mixed", "fsdp", "activation-checkpointing")), ("bigbird", ("fsdp",)),
    # DDP, bigbird-before's strategy, on the smoke ViT (smoke BigBird leaves parameters unused: DDP refuses it).
    ("vit", ("ddp",)))
DIST_RANKS = 2


def cases(tier: str) -> Iterator[tuple[Recipe, RunOptions]]:
    """Each case of ``tier``: its recipe and how it runs."""
    if tier == "cpu":
        for techniques in for_workload("vit", registry.default_selection()):
            yield resolve("vit", "smoke", techniques), RunOptions(device="cpu")
    elif tier == "converged":
        for techniques in accuracy.CONVERGED_CASES:
            yield resolve("vit", CONVERGED, techniques), RunOptions(device="cpu")
    elif tier == "sim":
        for techniques in for_workload("vit", registry.default_selection()):
            yield resolve("vit", "article", techniques), RunOptions(device="sim", profile="article")
    elif tier == "dist":
        for work, techniques in DIST_RUNS:
            yield resolve(work, "smoke", techniques), RunOptions(device="cpu", evaluate=False, devices=DIST_RANKS)
    elif tier == "sim-current":
        for techniques in CHAIN:
            yield resolve("vit", "article", techniques), RunOptions(device="sim", profile="current")
    else:
        raise MemclaimsError(f"unknown tier {tier!r}; valid tiers: {', '.join(TIERS)}")


def why_not(recipe: Recipe, options: RunOptions) -> str | None:
    """Why this machine cannot run the case (the cpu tier's reasons, memclaims.recipes.requirements)."""
    tier = "sim" if options.device == "sim" else "cpu"
    # A sharded recipe is no case of the technique matrix: its 16-mixed runs as bf16-mixed on CPU
    # ranks and is baselined so (suite/cases/test_sharding.py), where the matrix skips a 16-mixed case.
    needs = run_needs(recipe, tier) if recipe.distributed else case_needs(recipe, tier)
    return requirements.reason(needs)


def done(path: Path) -> set[tuple[str, str, int | None]]:
    """(tier, recipe id, seed) of every case FILE already holds (seed None: the article's)."""
    if not path.exists():
        return set()
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            found.add((entry["tier"], entry["recipe"], entry.get("seed")))
    return found


def measure_case(tier: str, recipe: Recipe, options: RunOptions) -> list[dict[str, object]]:
    """The case's lines: one per Record (a sharded run has one per rank), or why it has none."""
    from memclaims.run import run_recipe

    reason = why_not(recipe, options)
    if reason:
        return [{"tier": tier, "recipe": recipe.id, "skipped": reason}]
    try:
        records = run_recipe(recipe, options)
    except MemclaimsError as error:
        return [{"tier": tier, "recipe": recipe.id, "error": str(error)}]
    return [{"tier": tier, "recipe": recipe.id, "record": record.to_dict()} for record in records]


def measure_candidate(tiers: Sequence[str], out: Path, only: Sequence[str] = (), seed: int | None = None) -> int:
    """Measure every case of ``tiers`` (or only the recipe ids ``only``) not yet in ``out``, at
    ``seed`` (default: the article's); returns how many failed."""
    finished, failed = done(out), 0
    todo = [(tier, recipe, options if seed is None else replace(options, seed=seed))
            for tier in tiers for recipe, options in cases(tier)
            if (tier, recipe.id, seed) not in finished and (not only or recipe.id in only)]
    for index, (tier, recipe, options) in enumerate(progress.steps(todo, "memclaims candidate"), 1):
        started = time.perf_counter()
        entries = measure_case(tier, recipe, options)
        if seed is not None:  # a rerun at another seed: readers of the article's seed skip it
            entries = [{**entry, "seed": seed} for entry in entries]
        failed += any("error" in e for e in entries)
        with out.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(e, sort_keys=True, allow_nan=False) + "\n" for e in entries)
        state = "skipped" if "skipped" in entries[0] else "failed" if "error" in entries[0] else "done"
        progress.say(f"memclaims candidate: [{index}/{len(todo)}] {tier}:{recipe.id} {state} "
                     f"({time.perf_counter() - started:.1f} s)")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memclaims.report.candidate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file (appended to; resumes)")
    parser.add_argument("--tiers", default=",".join(TIERS), help=f"comma-separated, from {', '.join(TIERS)}")
    parser.add_argument("--only", action="append", default=[], metavar="RECIPE_ID", help="only this case (repeat)")
    parser.add_argument("--seed", type=int, default=None, help="another seed than the article's 123")
    args = parser.parse_args(argv)
    tiers = [t for t in args.tiers.split(",") if t]
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        parser.error(f"unknown tier {unknown[0]!r}; valid tiers: {', '.join(TIERS)}")
    # Offline as every memclaims command (memclaims.core.offline): started by memclaims upgrade it inherits
    # the setting; started by hand it sets it here, before a case imports a Hub client.
    with offline.hub_mode(False, "memclaims upgrade's worker: no download option"):
        return 1 if measure_candidate(tiers, args.out, args.only, args.seed) else 0


if __name__ == "__main__":
    sys.exit(main())
