"""Collects the verdict of every test that checks a catalogued claim, for ``memclaims claims``.

Part of memclaims' pytest plugin (``memclaims.pytest.plugin`` registers it). Reads reports in
``pytest_runtest_logreport``, which also runs on the xdist controller for its workers' tests, and
writes once, from the controller, at the end of the session.
"""

from __future__ import annotations

import pytest

from memclaims.claims import runs as claim_runs
from memclaims.pytest.plugin import settings


class ClaimRecorder:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.session = claim_runs.now()
        self.entries: dict[str, dict[str, object]] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        pairs = claim_runs.claims_of(report.nodeid)
        if not pairs or (report.when != "call" and not (report.skipped or report.failed)):
            return
        verdict = claim_runs.verdict_of(report.outcome, report.when, hasattr(report, "wasxfail"),
                                        str(report.longrepr or ""))
        detail = dict(report.user_properties).get("detail", "")
        if verdict == "skipped" and isinstance(report.longrepr, tuple):
            detail = str(report.longrepr[2]).removeprefix("Skipped: ")
        for claim, tier in pairs:
            claim_runs.merge(self.entries, claim_runs.key(claim, tier), {
                "verdict": verdict, "detail": str(detail), "nodeid": report.nodeid,
                "at": claim_runs.now(), "session": self.session})

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput") or not self.entries:  # xdist workers: the controller writes
            return
        claim_runs.write(settings(self.config).artifacts / claim_runs.LAST_RUN_NAME, self.entries)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ClaimRecorder(config), "memclaims-claim-recorder")
