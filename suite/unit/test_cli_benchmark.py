"""`memclaims benchmark` times the cases the cpu tier runs and names the ones it skips (the nightly's
`memclaims benchmark` docs command exited 2 on expandable-segments, which the CPU refuses)."""

from __future__ import annotations

import pytest

from memclaims import cli


def test_the_benchmark_skips_what_the_cpu_tier_refuses(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []
    monkeypatch.setattr("memclaims.run.run_recipe", lambda recipe, options: ran.append(recipe.id))
    assert cli.main(["benchmark"]) == 0
    out = capsys.readouterr().out
    assert "vit-smoke/expandable-segments" not in ran and "vit-smoke/pytorch" in ran
    assert "vit-smoke/expandable-segments" in out and "skipped" in out
    assert f"total ({len(ran)} cases)" in out
