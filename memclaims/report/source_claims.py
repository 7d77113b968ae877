"""``memclaims reproduce --device sim --source NAME``: one source's claims, predicted on the sim.

Each claim of the source (``memclaims/resources/sources/NAME.json``) that the sim checks is judged on
the Records its check names, replayed at the article's scale (the claim's workload), as the sim tier
of ``pytest`` judges it; the others are listed with the reason the sim does not check them. The
quoted phrase, the published numbers and the prediction's detail are printed side by side.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from memclaims.claims import catalogue
from memclaims.claims.lookup import Key, Lookup, load_only, recipe_of
from memclaims.core import published
from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.recipes.run_options import RunOptions
from memclaims.run import model_parameters, run_recipe

SIM_SCALE = "article"


@dataclass
class SourceRow:
    claim: str
    phrase: str
    published: dict[str, object]
    verdict: str  # holds | does not hold | not checked on the sim
    detail: str
    profile: str  # the sim profile the claim was predicted on (with ``--era``, its eras: memclaims.core.library_eras)


def predict(source: str, profile: str = "article") -> list[SourceRow]:
    if source not in published.documents():
        raise UsageError(f"--source {source}: no such source; valid: {', '.join(published.documents())}")
    rows = []
    for claim in (c for c in catalogue.CLAIMS if c.document == source):
        if claim.check is None or "sim" not in claim.tiers:
            rows.append(SourceRow(claim.name, claim.statement, claim.published, "not checked on the sim",
                                  catalogue.skip_reason(claim, "sim") or "", profile))
            continue
        scale = claim.check.scale_on("sim") or SIM_SCALE
        workload = claim.workload

        def record(key: Key, workload: str = workload, scale: str = scale) -> Record:
            options = RunOptions(device="sim", profile=profile, load_only=load_only(key))
            return run_recipe(recipe_of(key, workload, scale), options)[0]

        verdict = claim.check.run("sim", Lookup(record, model_parameters))
        rows.append(SourceRow(claim.name, claim.statement, claim.published,
                              "holds" if verdict.passed else "does not hold", verdict.detail, profile))
    return rows


def markdown(source: str, rows: list[SourceRow], profile: str = "article") -> str:
    from memclaims.report.run_summary import profile_words

    title = published.documents()[source]["title"]
    lines = [f"# {source}: {title}", "", f"Predicted on the sim, {profile_words(profile)}.", "", "| claim | published | sim verdict | predicted |", "|---|---|---|---|"]
    for row in rows:
        said = "; ".join(f"{k} {v}" for k, v in row.published.items()) or f"\"{row.phrase}\""
        lines.append(f"| {row.claim} | {said} | {row.verdict} | {row.detail} |")
    return "\n".join(lines)


def to_json(rows: list[SourceRow]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2, sort_keys=True)
