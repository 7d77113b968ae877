"""The version matrix's report: which numbers moved under which library (``noxfile.py``).

Each combination's pytest run leaves its end-of-run comparison table as JSON (every metric of
every case against the committed baselines, with the library versions that differ). This prints,
per combination, the metrics outside tolerance, so an upgrade's effect is one table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memclaims.compare import OK, fmt_short


def report(folder: Path) -> list[str]:
    lines = [f"{'combination':<36} {'case':<56} {'metric':<40} {'baseline':>12} {'now':>12}  verdict  "
             f"(what changed since the baseline)"]
    files = sorted(folder.glob("*.json"))
    if not files:
        return [f"no results in {folder}: run `nox -s matrix` first"]
    for path in files:
        result = json.loads(path.read_text(encoding="utf-8"))
        rows = result.get("rows", [])
        moved = [r for r in rows if r["verdict"] not in (OK, "info")]
        if not rows:
            lines.append(f"{path.stem:<36} ran no case: {result.get('error') or 'see its log'}")
        elif not moved:
            lines.append(f"{path.stem:<36} {len(rows)} numbers compared, none moved beyond tolerance")
        for r in moved:
            lines.append(f"{path.stem:<36} {r['case']:<56} {r['metric']:<40} "
                         f"{fmt_short(r['metric'], r['baseline']):>12} {fmt_short(r['metric'], r['now']):>12}  "
                         f"{r['verdict']}  ({_changed(r.get('environment_change', ''))})")
    return lines


def _changed(environment_change: str) -> str:
    """Only the packages that changed: ``lightning 2.6.6 -> 2.5.6``."""
    parts = [p.strip() for p in environment_change.split(",")]
    return ", ".join(p for p in parts if "->" in p or p.startswith("baseline from")) or "nothing recorded"


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "memclaims-results/matrix")
    print("\n".join(report(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
