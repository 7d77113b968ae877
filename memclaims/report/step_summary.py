"""A short markdown summary of one pytest run for a CI job page (GitHub Actions appends what a step
writes to ``$GITHUB_STEP_SUMMARY``): failures first, the claims' verdict counts per tier, the
environment. Made from the run's summary document (memclaims.report.summary_document); the HTML report
holds the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memclaims.baselines.compare import Summary, fmt_short
from memclaims.report.summary_document import claim_verdicts

# A job page is read at a glance: the first failures in full-width lines, the rest counted.
SHOWN_FAILURES = 10
FIRST_LINE_CHARS = 300


def _first_line(message: str) -> str:
    line = next((part.strip() for part in message.splitlines() if part.strip()), "")
    return line if len(line) <= FIRST_LINE_CHARS else line[:FIRST_LINE_CHARS] + "..."


def markdown(data: dict[str, Any], html: Path | None = None) -> str:
    outcomes = data["outcomes"]
    failures = data["failures"]
    failed = bool(failures or data["out_of_memory"])
    counts = ", ".join(f"{n} {name}" for name, n in sorted(outcomes.items())) or "no tests reported"
    lines = [f"## memclaims: {'FAILED' if failed else 'passed'} ({counts})", ""]
    if failures:
        lines.append("### Failures")
        lines += [f"- `{f['nodeid']}`: {_first_line(f.get('line') or f['message'])}" for f in failures[:SHOWN_FAILURES]]
        if len(failures) > SHOWN_FAILURES:
            lines.append(f"- ... and {len(failures) - SHOWN_FAILURES} more (the HTML report lists them all)")
        lines.append("")
    for entry in data["out_of_memory"]:
        lines.append(f"- out of memory: `{entry['case']}` in phase {entry['phase']}")
    worst = Summary(rows=list(data["rows"])).worst_first()
    if worst:
        lines += ["### Baselines", "", "| case | metric | baseline | now | change | verdict |", "|---|---|---|---|---|---|"]
        lines += [f"| `{r['case']}` | {r['metric']} | {fmt_short(r['metric'], r['baseline'])} | "
                  f"{fmt_short(r['metric'], r['now'])} | {r.get('change', '')} | {r['verdict']} |"
                  for r in worst[:SHOWN_FAILURES]]
        lines.append("")
    elif data["rows"]:
        lines += [f"{len(data['rows'])} baseline comparisons, all within tolerance.", ""]
    verdicts = claim_verdicts(data)
    if verdicts:
        lines += ["### Claims", "", "| tier | verdicts |", "|---|---|"]
        lines += [f"| {tier} | " + ", ".join(f"{n} {v}" for v, n in sorted(c.items())) + " |"
                  for tier, c in sorted(verdicts.items())]
        lines.append("")
    session = data["session"]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(session.get("versions", {}).items()) if v)
    environments = ", ".join(sorted({r.get("environment", "") for r in data["rows"]} - {""}))
    lines.append(f"**Environment**: {versions or 'versions not recorded'}"
                 + (f"; baseline environment {environments}" if environments else ""))
    if html is not None:
        lines.append(f"\nFull report: `{html.name}` (the job's artifacts).")
    return "\n".join(lines) + "\n\n"
