"""The HTML report of one pytest run: one self-contained file (inline CSS, bars drawn with CSS, no
script, nothing fetched at view time) made from the run's summary document
(memclaims.report.summary_document). Written by ``pytest --memclaims-html PATH`` and by ``memclaims report
SUMMARY.json``.

Order: what failed and why (the terminal's message), the comparisons that need a look, each case's
per-phase memory against its baseline, the claims this run gave a verdict (per tier; the unchecked ones
counted, not listed), the environment and what changed since the baseline, the diagnosis files the run saved.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any

from memclaims.baselines.compare import Summary, fmt_short
from memclaims.core import output_files
from memclaims.core.published import TIERS
from memclaims.report.summary_document import claim_verdicts, environment_changes, phase_bars

MIB = 1024 * 1024
# A verdict's colour class: failing, needs a look, fine, not run.
_BAD = ("regression", "missing", "refused", "no baseline", "does not hold", "error", "failed")
_LOOK = ("stale", "new", "skipped", "holds, but")
_GOOD = ("ok", "holds", "does not hold (expected)", "updated", "info", "passed")

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1100px;
color:#1b1f24;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.88em;margin:.4em 0} th,td{border:1px solid #d0d7de;padding:.25em .5em;
text-align:left;vertical-align:top} th{background:#f6f8fa}
pre{background:#fff5f5;border-left:4px solid #cf222e;padding:.6em;white-space:pre-wrap;font-size:.85em}
.bad{background:#ffebe9;color:#82071e;font-weight:600} .look{background:#fff8c5} .good{background:#dafbe1}
.none{color:#8c959f} .status{font-size:1.1em;padding:.4em .7em;display:inline-block;border-radius:4px}
.bars td.bar{width:60%} .bar div{height:.8em;margin:1px 0} .b{background:#8c959f} .n{background:#0969da}
.n.worse{background:#cf222e} .muted{color:#57606a;font-size:.9em}
"""


def _class(verdict: str) -> str:
    text = verdict.lower()
    if text.startswith(_LOOK) or text == "xpassed":
        return "look"
    if text in _GOOD or text == "xfailed":
        return "good"
    if text.startswith(_BAD):
        return "bad"
    return "none"


def _cell(verdict: str) -> str:
    return f'<td class="{_class(verdict)}">{escape(verdict)}</td>'


def _table(header: tuple[str, ...], body: list[str]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _status(data: dict[str, Any]) -> str:
    outcomes = data["outcomes"]
    failed = outcomes.get("failed", 0) + outcomes.get("error", 0) + len(data["out_of_memory"])
    counts = ", ".join(f"{n} {name}" for name, n in sorted(outcomes.items())) or "no tests reported"
    word, kind = ("FAILED", "bad") if failed or data["failures"] else ("PASSED", "good")
    session = data["session"]
    when = escape(str(session.get("started", "unknown time")))
    selection = escape(" ".join(session.get("arguments", [])) or "(no arguments)")
    return (f'<p><span class="status {kind}">{word}</span> {escape(counts)}</p>'
            f'<p class="muted">started {when} (UTC), {session.get("duration_s", "?")} s; '
            f"pytest {selection}; exit status {session.get('exit_status', '?')}</p>")


def _failures(data: dict[str, Any]) -> str:
    parts = ['<h2 id="failures">What failed and why</h2>']
    if not data["failures"] and not data["out_of_memory"]:
        parts.append("<p>Nothing failed.</p>")
    for failure in data["failures"]:
        parts.append(f"<h3>{escape(failure['nodeid'])} <span class='muted'>({escape(failure['when'])})</span></h3>"
                     f"<pre>{escape(failure['message'])}</pre>")
    for entry in data["out_of_memory"]:
        size = "unknown" if entry.get("requested_bytes") is None else f"{entry['requested_bytes']:,} B"
        parts.append(f"<p class='bad'>out of memory: {escape(entry['case'])}, phase {escape(str(entry['phase']))}, "
                     f"requested {size}</p>")
    return "".join(parts)


def _comparisons(data: dict[str, Any]) -> str:
    rows = Summary(rows=list(data["rows"])).worst_first()
    parts = ['<h2 id="baselines">Baseline comparisons that need a look</h2>']
    if not data["rows"]:
        return parts[0] + "<p>No case was compared with a baseline.</p>"
    if not rows:
        return parts[0] + f"<p>All {len(data['rows'])} comparisons within tolerance.</p>"
    body = [f"<tr><td>{escape(r['case'])}</td><td>{escape(r.get('environment', ''))}</td>"
            f"<td>{escape(r['metric'])}</td><td>{escape(fmt_short(r['metric'], r['baseline']))}</td>"
            f"<td>{escape(fmt_short(r['metric'], r['now']))}</td><td>{escape(str(r.get('change', '')))}</td>"
            f"{_cell(r['verdict'])}</tr>" for r in rows]
    return parts[0] + _table(("case", "environment", "metric", "baseline", "now", "change", "verdict"), body)


def _claims(data: dict[str, Any]) -> str:
    parts = ['<h2 id="claims">Claims</h2>']
    counts = claim_verdicts(data)
    if not counts:
        return parts[0] + "<p>No claim was checked in this run.</p>"
    parts.append("<p>" + "; ".join(f"{tier}: " + ", ".join(f"{n} {v}" for v, n in sorted(c.items()))
                                   for tier, c in sorted(counts.items())) + "</p>")
    body, unjudged = [], 0
    for row in data["claims"]:
        if not any(cell.get("at") for cell in row["tiers"].values()):  # as claim_verdicts counts them
            unjudged += 1  # a claim this run did not check: counted, not a row of dashes
            continue
        cells = []
        for tier in TIERS:
            cell = row["tiers"].get(tier, {})
            if "checked_by" not in cell:
                cells.append('<td class="none" title="not checked on this tier">.</td>')
            elif cell["verdict"] == "not run":
                cells.append('<td class="none">-</td>')
            else:
                title = escape(str(cell.get("detail", "")), quote=True)
                cells.append(f'<td class="{_class(cell["verdict"])}" title="{title}">{escape(cell["verdict"])}</td>')
        body.append(f"<tr><td>{escape(row['claim'])}</td><td>{escape(row['kind'])}</td>{''.join(cells)}"
                    f"<td>{escape(str(row['where']))}</td></tr>")
    legend = "<p class='muted'>-: checked on that tier, not run here; .: not checked there (memclaims claims says why)"
    legend += f"; {unjudged} claim(s) this run did not check are left out (memclaims claims lists every one)</p>" \
        if unjudged else "</p>"
    return parts[0] + _table(("claim", "kind", *TIERS, "source"), body) + legend


def _bar(value: float | None, top: float, kind: str) -> str:
    width = 0.0 if value is None or top <= 0 else max(0.5, 100.0 * value / top)
    return f'<div class="{kind}" style="width:{width:.1f}%"></div>'


def _phases(data: dict[str, object]) -> str:
    parts = ['<h2 id="phases">Memory per phase against the baseline</h2>',
             "<p class='muted'>Each phase's absolute peak (reserved where the device has an allocator, else "
             "allocated); grey: baseline, blue: this run, red: this run above its baseline. MiB = 2^20 B.</p>"]
    bars = phase_bars(data)
    if not bars:
        return parts[0] + "<p>No per-phase peaks were compared in this run.</p>"
    for case, phases in sorted(bars.items()):
        top = max((v for pair in phases.values() for v in pair if v is not None), default=0.0)
        body = []
        for phase, (before, now) in phases.items():
            worse = before is not None and now is not None and now > before
            label = f"{fmt_short('allocated_bytes', before) or 'n/a'} -> {fmt_short('allocated_bytes', now) or 'n/a'}"
            body.append(f"<tr><td>{escape(phase)}</td><td class='bar'>{_bar(before, top, 'b')}"
                        f"{_bar(now, top, 'n worse' if worse else 'n')}</td><td>{escape(label)}</td></tr>")
        parts.append(f"<h3>{escape(case)}</h3><table class='bars'>{''.join(body)}</table>")
    return "".join(parts)


def _environment(data: dict[str, Any]) -> str:
    session = data["session"]
    versions = session.get("versions", {})
    body = [f"<tr><td>{escape(k)}</td><td>{escape(str(v))}</td></tr>" for k, v in sorted(versions.items())]
    environments = sorted({r.get("environment", "") for r in data["rows"]} - {""})
    parts = ['<h2 id="environment">Environment</h2>',
             f"<p>{escape(' on '.join(str(session[k]) for k in ('platform', 'host') if session.get(k)) or 'platform not recorded')}"
             f"; baseline environment ids: {escape(', '.join(environments) or 'none compared')}</p>",
             _table(("package", "version"), body) if body else "<p>Versions not recorded.</p>",
             "<h3>What changed since the baseline</h3>"]
    changes = environment_changes(data)
    if not changes:
        parts.append("<p>No comparison named a change of environment.</p>")
    for text, cases in changes.items():
        shown = ", ".join(cases[:6]) + (f" and {len(cases) - 6} more" if len(cases) > 6 else "")
        parts.append(f"<p>{escape(text)} <span class='muted'>({escape(shown)})</span></p>")
    return "".join(parts)


def _diagnosis(data: dict[str, Any], here: Path) -> str:
    parts = ['<h2 id="diagnosis">Saved breakdowns and CUDA snapshots</h2>']
    if not data["diagnosis"]:
        return parts[0] + "<p>None saved (only a case that fails on memory saves them).</p>"
    items = []
    for path in data["diagnosis"]:
        link = os.path.relpath(path, here) if os.path.isabs(path) else path
        note = " (open at pytorch.org/memory_viz)" if path.endswith(".pickle") else ""
        items.append(f"<li><a href=\"{escape(link, quote=True)}\">{escape(Path(path).name)}</a>{note}</li>")
    return parts[0] + f"<ul>{''.join(items)}</ul>"


def render(data: dict[str, object], here: Path = Path()) -> str:
    """The page; ``here``: the folder it is written to (links to saved files are relative to it)."""
    # What failed and why, then the cases that ran, then the claims they decided (those only).
    sections = (_status(data), _failures(data), _comparisons(data), _phases(data), _claims(data),
                _environment(data), _diagnosis(data, here))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>memclaims run report</title>"
            f"<style>{_STYLE}</style></head><body><h1>memclaims run report</h1>{''.join(sections)}</body></html>\n")


def write(data: dict[str, Any], path: Path, option: str = "--out") -> Path:
    """The page at ``path``, its folder created; OutputError (one line) when it cannot be written."""
    return output_files.write_text(path, render(data, path.resolve().parent), option)
