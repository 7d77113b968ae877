"""``memclaims upgrade SPEC...``: judge a candidate release against the committed baselines.

The candidate (``torch==2.15.0``, or ``lightning==2.6.6 transformers==5.24.0``) is installed into an
isolated environment built with uv, beside the other libraries the suite tests pinned at the
versions installed here, so that only what the specs name changes (a torchvision is left for uv to
match to a named torch: each is built for one torch). This very memclaims runs there (a copy of the
package on ``PYTHONPATH``) as the worker ``python -m memclaims.report.candidate``, which measures the cpu,
converged, dist and sim tiers; each Record is judged here as the pytest cases judge it
(memclaims.baselines.noise.judge: the baselines, the measured noise of a change, the seeds), and what moved is
reported per recipe, metric and phase, attributed to the packages that changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from memclaims.baselines.compare import INFO, MISSING, NEW, OK, REGRESSION, STALE, Comparison, fmt_short
from memclaims.baselines.store import BaselineStore
from memclaims.core import tested_versions
from memclaims.core.errors import MemclaimsError, UsageError
from memclaims.core.record import VERSIONED_PACKAGES, Record

DEFAULT_TIERS = ("cpu", "converged", "dist", "sim")
UV_INSTALL = "pip install uv"


class UpgradeError(MemclaimsError):
    """The candidate environment could not be built: one line saying what could not be installed or fetched."""


@dataclass(frozen=True)
class Spec:
    text: str
    name: str  # canonical: lower case, '-' for '_'


def parse_specs(texts: Sequence[str]) -> list[Spec]:
    """``torch==2.15.0`` ... as requirements (a bare ``torch``: its newest release); a malformed one is a
    usage error naming it."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    if not texts:
        raise UsageError("memclaims upgrade needs at least one SPEC, e.g. torch==2.15.0 (or torch: its newest "
                         "release), or --newest")
    specs = []
    for text in texts:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as error:
            raise UsageError(f"upgrade SPEC {text!r} is not a requirement ({str(error).splitlines()[0]}); "
                             "write e.g. torch==2.15.0") from None
        if requirement.extras or requirement.url or requirement.marker:
            raise UsageError(f"upgrade SPEC {text!r}: give a package and its versions only, e.g. "
                             f"{requirement.name}==X.Y.Z (or {requirement.name} alone: its newest release)")
        specs.append(Spec(text, canonicalize_name(requirement.name)))
    return specs


def newest(names: Sequence[str] = tested_versions.PACKAGES) -> list[Spec]:
    """A bare spec per package: its newest release that installs beside the rest (uv resolves it)."""
    return [Spec(name, name) for name in names]


def requirements(specs: Sequence[Spec]) -> list[str]:
    """What the candidate environment installs: the specs, the tested libraries pinned at the
    versions installed here unless a spec names them (torchvision is left free beside a named
    torch: uv picks the release built for it), and memclaims' other dependencies as declared."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    named = {s.name for s in specs}
    pinned = []
    for package in VERSIONED_PACKAGES:
        if package in named:
            continue
        if package == "torchvision" and "torch" in named:
            pinned.append("torchvision")
            continue
        try:
            pinned.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue  # not installed here (bitsandbytes is optional for the cases that need it)
    others = []
    for line in metadata.requires("memclaims") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        if canonicalize_name(requirement.name) not in named | set(VERSIONED_PACKAGES):
            others.append(str(requirement))
    return [s.text for s in specs] + pinned + others


class Builder(Protocol):
    def build(self, folder: Path, packages: Sequence[str], specs: Sequence[str] = ()) -> Path:
        """Create an environment in ``folder`` with ``packages`` (``specs``: the candidate's own, for
        messages); return its Python."""


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise UsageError(f"memclaims upgrade builds its environment with uv, which is not installed: {UV_INSTALL}") \
                from None
        return found
    return str(find_uv_bin())


def explain_install_failure(output: str, specs: Sequence[str]) -> str:
    """uv's failure as one line: a spec no release satisfies, or what could not be fetched."""
    lines = [line.strip(" ×│╰─▶").removeprefix("cause: ").removeprefix("Caused by: ")
             for line in output.splitlines() if line.strip()]
    for marker in ("Failed to fetch", "error sending request", "dns error", "Could not connect", "failed to lookup",
                   "Network is unreachable", "Connection refused"):
        hit = next((line for line in lines if marker.lower() in line.lower()), None)
        if hit:
            return f"no network: could not fetch what the candidate needs ({hit})"
    hit = next((line for line in lines if "no version of" in line or "unsatisfiable" in line or
                "not found in the package registry" in line), None)
    if hit:
        return f"no installable release for {' '.join(specs)}: {hit}"
    return f"the candidate environment could not be built: {lines[-1] if lines else 'uv failed without output'}"


@dataclass
class UvBuilder:
    """Environments built by uv (``uv venv`` + ``uv pip install``), from this interpreter's Python."""

    progress: Callable[[str], None] = lambda text: None

    def build(self, folder: Path, packages: Sequence[str], specs: Sequence[str] = ()) -> Path:
        uv = _uv()
        python = folder / "bin" / "python"
        if not python.exists():
            self._run([uv, "venv", "--quiet", "--python", sys.executable, str(folder)], specs)
        self.progress(f"installing {' '.join(specs or packages)} and the rest of the stack into {folder}")
        self._run([uv, "pip", "install", "--quiet", "--python", str(python), *packages], specs or packages)
        return python

    @staticmethod
    def _run(command: list[str], specs: Sequence[str]) -> None:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise UpgradeError(explain_install_failure(done.stdout + done.stderr, specs))


def package_copy(folder: Path) -> Path:
    """A copy of this memclaims package (code and data) for the candidate's ``PYTHONPATH``: the very
    code that judges runs there, whether this one is a checkout or an installed wheel."""
    import memclaims

    source = Path(memclaims.__file__).resolve().parent
    target = folder / "memclaims"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return folder


@dataclass(frozen=True)
class Worker:
    """The worker command in the candidate environment."""

    python: Path
    pythonpath: Path

    def run(self, out: Path, tiers: Sequence[str], only: Sequence[str] = (), seed: int | None = None) -> None:
        command = [str(self.python), "-m", "memclaims.report.candidate", "--out", str(out), "--tiers", ",".join(tiers),
                   *(arg for recipe in only for arg in ("--only", recipe)), *(["--seed", str(seed)] if seed else [])]
        env = {**os.environ, "PYTHONPATH": str(self.pythonpath)}
        env.pop("ATEN_CPU_CAPABILITY", None)
        done = subprocess.run(command, env=env, check=False)
        if done.returncode not in (0, 1):  # 1: some cases failed, each line says which
            raise MemclaimsError(f"the candidate's worker stopped with exit status {done.returncode}: {' '.join(command)}")

    def accuracy_at(self, tier: str, recipe_id: str, seed: int, scratch: Path) -> float:
        out = scratch / f"{recipe_id.replace('/', '_')}-seed{seed}.jsonl"
        self.run(out, [tier], only=[recipe_id], seed=seed)
        for line in out.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if "record" in entry and entry["record"]["accuracy"] is not None:
                return float(entry["record"]["accuracy"])
        raise MemclaimsError(f"the candidate measured no accuracy for {recipe_id} at seed {seed}")


@dataclass
class Report:
    """What moved: every comparison, and the cases the candidate could not run."""

    comparisons: list[tuple[str, Comparison]] = field(default_factory=list)  # (tier, comparison)
    not_run: list[tuple[str, str, str]] = field(default_factory=list)  # (tier, recipe, why): skipped here
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (tier, recipe, error): failed to run
    no_baseline: list[tuple[str, str]] = field(default_factory=list)  # (tier, baseline key)
    stack: dict[str, str | None] = field(default_factory=dict)  # the tested packages the candidate ran
    # The locked releases it changed: package -> (locked, candidate); empty without --lock.
    lock_change: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Every case ran or was skipped with its reason, and no number got worse than its baseline."""
        return not self.regressions and not self.errors and bool(self.comparisons)

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return self._rows((REGRESSION, MISSING))

    @property
    def improvements(self) -> list[dict[str, Any]]:
        return self._rows((STALE,))

    def _rows(self, verdicts: tuple[str, ...]) -> list[dict[str, Any]]:
        rows = [dict(row, tier=tier, changed=_attributed(row["environment_change"]))
                for tier, comparison in self.comparisons for row in comparison.rows() if row["verdict"] in verdicts]
        return sorted(rows, key=lambda r: -abs(r["change_pct"] or 0.0))

    def counts(self) -> dict[str, dict[str, int]]:
        """Per tier: how many numbers were compared, and how many kept their value exactly."""
        out: dict[str, dict[str, int]] = {}
        for tier, comparison in self.comparisons:
            entry = out.setdefault(tier, {"cases": 0, "numbers": 0, "unchanged": 0, "within_tolerance": 0,
                                          "reported": 0})
            entry["cases"] += 1
            for result in comparison.results:
                entry["numbers"] += 1
                if result.verdict == INFO:
                    entry["reported"] += 1
                elif result.verdict == OK and result.baseline == result.now:
                    entry["unchanged"] += 1
                elif result.verdict in (OK, NEW):
                    entry["within_tolerance"] += 1
        return out

    def as_dict(self) -> dict[str, object]:
        return {"regressions": self.regressions, "improvements": self.improvements, "counts": self.counts(),
                "stack": self.stack, "lock_change": {p: list(v) for p, v in self.lock_change.items()},
                "not_run": [{"tier": t, "recipe": r, "why": w} for t, r, w in self.not_run],
                "errors": [{"tier": t, "recipe": r, "error": e} for t, r, e in self.errors],
                "no_baseline": [{"tier": t, "key": k} for t, k in self.no_baseline],
                "comparisons": [dict(row, tier=tier) for tier, c in self.comparisons for row in c.rows()]}


def _attributed(environment_change: str) -> str:
    """The packages (or CPU class) that changed since the baseline, from the comparison's sentence."""
    parts = [p.strip() for p in environment_change.split(",")]
    return ", ".join(p for p in parts if "->" in p or p.startswith("baseline from")) or "nothing recorded"


def judge_file(path: Path, store: BaselineStore, rerun: Callable[[str, str, int], float] | None) -> Report:
    """Every Record of a worker's file against its baseline; ``rerun(tier, recipe, seed)``: an accuracy
    measured again in the candidate environment at another seed."""
    from memclaims.baselines.noise import judge

    report = Report()
    noise = store.noise()
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line) if line.strip() else {}
        tier = str(entry.get("tier", ""))
        if "record" not in entry:
            if entry.get("error"):
                report.errors.append((tier, str(entry.get("recipe")), str(entry["error"])))
            elif entry:
                report.not_run.append((tier, str(entry.get("recipe")), str(entry.get("skipped"))))
            continue
        record = Record.from_dict(entry["record"])
        report.stack = report.stack or {p: record.versions.get(p) for p in tested_versions.PACKAGES}
        profile = record.probe.partition(":")[2] or None if record.device == "sim" else None
        found = store.find(record, profile)
        if found is None:
            report.no_baseline.append((tier, record.baseline_key))
            continue
        baseline, baseline_environment = found
        seeded = None if rerun is None else (lambda seed, t=tier, r=record.recipe: rerun(t, r, seed))
        report.comparisons.append((tier, judge(record, baseline.record, baseline_environment, noise,
                                               overrides=baseline.tolerances, case_id=f"{tier}:{record.baseline_key}",
                                               rerun=seeded)))
    return report


def markdown(report: Report, specs: Sequence[Spec]) -> str:
    """upgrade.md: regressions first, then improvements (stale baselines), then what did not move."""
    title = " ".join(s.text for s in specs)
    lines = [f"# memclaims upgrade {title}", ""]
    if report.stack:
        lines += ["Candidate stack: " + ", ".join(f"{p} {v or 'not installed'}" for p, v in report.stack.items()), ""]
    if report.lock_change:
        lines += ["Against the lock: " + ", ".join(f"{p} {a} -> {b}" for p, (a, b) in report.lock_change.items()), ""]
    for heading, rows, empty in (("Regressions", report.regressions, "none"),
                                 ("Improvements (stale baselines: refresh with --update-baselines)",
                                  report.improvements, "none")):
        lines += [f"## {heading}", ""]
        if not rows:
            lines += [empty, ""]
            continue
        lines += ["| case | metric | baseline | candidate | change | tolerance | changed since the baseline |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            where = f" ({r['detail']})" if r.get("detail") else ""
            lines.append(f"| {r['case']} | {r['metric']}{where} | {fmt_short(r['metric'], r['baseline'])} | "
                         f"{fmt_short(r['metric'], r['now'])} | {r['change']} | {r['tolerance']} | {r['changed']} |")
        lines.append("")
    lines += ["## Unchanged", "", "| tier | cases | numbers | exactly unchanged | moved within tolerance | reported only |",
              "|---|---|---|---|---|---|"]
    for tier, c in sorted(report.counts().items()):
        lines.append(f"| {tier} | {c['cases']} | {c['numbers']} | {c['unchanged']} | {c['within_tolerance']} | "
                     f"{c['reported']} |")
    if report.not_run or report.no_baseline or report.errors:
        lines += ["", "## Not compared", ""]
        lines += [f"- {t}:{r}: failed: {error}" for t, r, error in report.errors]
        lines += [f"- {t}:{r}: {why}" for t, r, why in report.not_run]
        lines += [f"- {t}:{k}: no committed baseline" for t, k in report.no_baseline]
    return "\n".join(lines) + "\n"


def upgrade(specs: Sequence[Spec], out: Path, store: BaselineStore, *, builder: Builder | None = None,
            tiers: Sequence[str] = DEFAULT_TIERS, env_dir: Path | None = None, lock_file: Path | None = None,
            progress: Callable[[str], None] = lambda text: None) -> Report:
    """Build the candidate, measure it, judge it; writes upgrade.md, upgrade.json and records.jsonl
    in ``out``. ``lock_file``: the candidate is that lock with the specs applied (``out/lock.txt``,
    memclaims.report.lock), not the specs beside this environment's releases."""
    from memclaims.report import lock

    out.mkdir(parents=True, exist_ok=True)
    builder = builder or UvBuilder(progress)
    lock_change: dict[str, tuple[str, str]] = {}
    if lock_file is not None:
        progress(f"compiling the candidate's lock from {lock_file} with {' '.join(s.text for s in specs)}")
        candidate_lock = lock.compile_candidate(lock_file, [s.text for s in specs], out / "lock.txt", _uv())
        lock_change = lock.changed(lock.pins(lock_file), lock.pins(candidate_lock), (*tested_versions.PACKAGES, "peft"))
        packages = ["--requirement", str(candidate_lock)]
    else:
        packages = requirements(specs)
    with tempfile.TemporaryDirectory(prefix="memclaims-upgrade-") as scratch:
        folder = env_dir or Path(scratch) / "env"
        python = builder.build(folder, packages, [s.text for s in specs])
        worker = Worker(python, package_copy(Path(scratch) / "code"))
        records = out / "records.jsonl"
        progress(f"measuring {', '.join(tiers)} in {folder}")
        worker.run(records, tiers)
        report = judge_file(records, store, lambda tier, recipe, seed: worker.accuracy_at(tier, recipe, seed,
                                                                                           Path(scratch)))
    report.lock_change = lock_change
    (out / "upgrade.md").write_text(markdown(report, specs), encoding="utf-8")
    (out / "upgrade.json").write_text(json.dumps({"specs": [s.text for s in specs], **report.as_dict()}, indent=2,
                                                 sort_keys=True, default=str) + "\n", encoding="utf-8")
    return report


def summary_lines(report: Report) -> list[str]:
    """The terminal's short version of upgrade.md."""
    lines = [f"regression: {r['case']} {r['metric']} {fmt_short(r['metric'], r['baseline'])} -> "
             f"{fmt_short(r['metric'], r['now'])} ({r['change']}) [{r['changed']}]" for r in report.regressions]
    lines += [f"improved: {r['case']} {r['metric']} {fmt_short(r['metric'], r['baseline'])} -> "
              f"{fmt_short(r['metric'], r['now'])} ({r['change']}) [{r['changed']}]" for r in report.improvements]
    lines += [f"failed: {t}:{r}: {error}" for t, r, error in report.errors]
    if report.lock_change:
        lines.append("against the lock: " + ", ".join(f"{p} {a} -> {b}" for p, (a, b) in report.lock_change.items()))
    for tier, c in sorted(report.counts().items()):
        lines.append(f"{tier}: {c['cases']} cases, {c['numbers']} numbers: {c['unchanged']} unchanged, "
                     f"{c['within_tolerance']} within tolerance, {c['reported']} reported only")
    return lines


def moved(report: Report) -> str:
    """What the candidate moved, in one sentence for the tested-release record."""
    counts = report.counts()
    numbers = sum(c["numbers"] for c in counts.values())
    unchanged = sum(c["unchanged"] for c in counts.values())
    within = sum(c["within_tolerance"] for c in counts.values())
    tiers = ", ".join(f"{tier} {c['cases']}" for tier, c in sorted(counts.items()))
    worse = "; ".join(f"{r['case']} {r['metric']} {r['change']}" for r in report.regressions[:5]) or "none"
    better = "; ".join(f"{r['case']} {r['metric']} {r['change']}" for r in report.improvements[:5]) or "none"
    return (f"cases compared per tier: {tiers}; {numbers} numbers: {unchanged} exactly unchanged, {within} moved "
            f"within tolerance; regressions: {worse}; improvements past tolerance: {better}; "
            f"{len(report.not_run)} cases skipped with their reason, {len(report.errors)} failed")
