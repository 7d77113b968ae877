"""Progress of long commands: a bar on a terminal, nothing in a log, the items unchanged either way."""

from __future__ import annotations

import io

import pytest

from memclaims.core import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()  # a CI log or a redirected run: not a TTY
    monkeypatch.setattr("sys.stderr", log)
    assert list(progress.steps(range(3), "fit vit")) == [0, 1, 2]
    assert log.getvalue() == "" and not progress.shown()


def test_a_terminal_gets_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert list(progress.steps(["a", "b"], "reproduce on cpu")) == ["a", "b"]
    assert "reproduce on cpu:   0%" in terminal.getvalue() and "0/2" in terminal.getvalue()  # drawn, then cleared
    assert progress.shown()


def test_the_upgrade_candidate_draws_a_bar_over_its_cases_and_says_each_above_it(monkeypatch, tmp_path) -> None:
    """``memclaims upgrade``'s worker: a bar over the cases on a terminal, each case's line above it
    (and the line alone in a log)."""
    from memclaims.report import candidate

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(candidate, "measure_case",
                        lambda tier, recipe, options: [{"tier": tier, "recipe": recipe.id, "skipped": "scripted"}])
    only = ["vit-smoke/fabric", "vit-smoke/bf16-true"]
    assert candidate.measure_candidate(["cpu"], tmp_path / "records.jsonl", only=only) == 0
    drawn = terminal.getvalue()
    assert "memclaims candidate:   0%" in drawn and "0/2" in drawn
    assert "[1/2] cpu:vit-smoke/fabric skipped" in drawn and "[2/2] cpu:vit-smoke/bf16-true skipped" in drawn
