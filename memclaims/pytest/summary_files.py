"""The run's summary document (memclaims.report.summary_document) and what is made from it at the end of a
session: the summary JSON (``--memclaims-summary-json``), the HTML report (``--memclaims-html``) and,
where ``$GITHUB_STEP_SUMMARY`` names a file (a GitHub Actions job), a markdown summary appended to it.

Part of memclaims' pytest plugin (``memclaims.pytest.plugin`` registers it). Reports are read in
``pytest_runtest_logreport``, which also runs on the xdist controller for its workers' tests; the
files are written once, by the controller, after the claim recorder and the baseline table are done.
"""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from memclaims.core import output_files
from memclaims.core.record import library_versions
from memclaims.core.settings import BY_NAME
from memclaims.pytest.plugin import OOM_KEY, SUMMARY_KEY, settings
from memclaims.report import html_report, step_summary, summary_document
from memclaims.report.summary_document import SCHEMA

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
SUMMARY_JSON_OPTION, HTML_OPTION = BY_NAME["summary-json"].pytest_option, BY_NAME["html"].pytest_option
# A failure's message as the terminal shows it, up to this many characters (a traceback of a
# crash can be megabytes; the report links the junit/terminal output for the rest).
MESSAGE_CHARS = 8000
# What the run saved to diagnose a memory failure (memclaims.measure.diagnosis.save_memory_failure).
DIAGNOSIS_GLOBS = ("*.breakdown.json", "*.snapshot.pickle")


class RunSummary:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.time()
        self.outcomes: Counter[str] = Counter()
        self.failures: list[dict[str, str]] = []

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed) or report.failed:
            outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else \
                "error" if report.failed and report.when != "call" else report.outcome
            self.outcomes[outcome] += 1
        if report.failed:
            text = report.longreprtext
            if len(text) > MESSAGE_CHARS:
                text = "...\n" + text[-MESSAGE_CHARS:]
            crash = getattr(report.longrepr, "reprcrash", None)  # what pytest's short summary shows
            line = crash.message if crash is not None else next(
                (part.strip() for part in report.longreprtext.splitlines() if part.strip()), "")
            self.failures.append({"nodeid": report.nodeid, "when": report.when, "message": text,
                                  "line": line.splitlines()[0] if line else ""})

    def document(self, exitstatus: int) -> dict[str, Any]:
        table = self.config.stash.get(SUMMARY_KEY, None)
        recorder = self.config.pluginmanager.get_plugin("memclaims-claim-recorder")
        entries = recorder.entries if recorder is not None else {}
        artifacts = settings(self.config).artifacts
        saved = sorted(str(path) for pattern in DIAGNOSIS_GLOBS for path in artifacts.glob(pattern)
                       if path.stat().st_mtime >= self.started)
        invocation = self.config.invocation_params
        return {
            "schema": SCHEMA,
            "rows": table.rows if table is not None else [],
            "out_of_memory": self.config.stash.get(OOM_KEY, []),
            "failures": self.failures,
            "outcomes": dict(self.outcomes),
            "claims": claims_table(entries) if entries else [],
            "diagnosis": saved,
            "session": {
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
                "duration_s": round(time.time() - self.started, 3),
                "exit_status": int(exitstatus),
                "arguments": [str(a) for a in invocation.args],
                "markexpr": str(self.config.getoption("markexpr", "") or ""),
                "versions": library_versions(),
                "platform": platform.platform(),
                "host": platform.node(),
            },
        }

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        chosen = settings(config)
        wanted = chosen.summary_json is not None or chosen.html is not None or os.environ.get(STEP_SUMMARY_ENV)
        if not wanted or hasattr(config, "workerinput"):
            return
        data = self.document(exitstatus)
        written: list[Path] = []
        try:  # the folders were proved writable at configure; a disk can still fill up since
            if chosen.summary_json is not None:
                written.append(output_files.write_text(chosen.summary_json, summary_document.dump(data),
                                                       SUMMARY_JSON_OPTION))
            if chosen.html is not None:
                written.append(html_report.write(data, chosen.html, HTML_OPTION))
        except output_files.OutputError as error:
            terminalreporter.write_line(f"memclaims: NOT written: {error}", red=True)
        step = os.environ.get(STEP_SUMMARY_ENV)
        if step:
            try:
                with open(step, "a", encoding="utf-8") as handle:
                    handle.write(step_summary.markdown(data, html=chosen.html))
            except OSError as error:  # a CI detail must never hide the run's own result
                terminalreporter.write_line(f"memclaims: ${STEP_SUMMARY_ENV} not written: {error}")
        for path in written:
            terminalreporter.write_line(f"memclaims: comparison written to {path}")


def pytest_configure(config: pytest.Config) -> None:
    chosen = settings(config)
    if not hasattr(config, "workerinput"):  # the controller writes them: their folders must exist and take a file
        for path, option in ((chosen.summary_json, SUMMARY_JSON_OPTION), (chosen.html, HTML_OPTION)):
            if path is not None:
                try:
                    output_files.prepare(path, option)
                except output_files.OutputError as error:
                    raise pytest.UsageError(str(error)) from None
    config.pluginmanager.register(RunSummary(config), "memclaims-run-summary")


def claims_table(entries: dict[str, dict[str, object]]) -> list[dict[str, object]]:
    """The catalogue's table with this run's verdicts, imported when a run has verdicts to show (the catalogue
    imports the recipes and torch: not at pytest's start)."""
    from memclaims.claims import catalogue

    return catalogue.table(entries)
