"""The data memclaims ships in its package: found through importlib.resources wherever memclaims is
installed, and written back by its generators only where that is a writable checkout."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims import cli
from memclaims.core import packaged
from memclaims.core.errors import UsageError
from memclaims.report import spread


@pytest.mark.parametrize("name", packaged.NAMES)
def test_every_packaged_file_is_in_the_package_and_is_json(name: str) -> None:
    found = packaged.resource(name)
    files = list(found.iterdir()) if name == packaged.SOURCES else [found]
    assert files and all(f.is_file() and isinstance(json.loads(f.read_text(encoding="utf-8")), dict) for f in files)
    assert Path(str(found)).is_relative_to(ROOT / "memclaims" / "resources")


def test_nothing_the_library_reads_is_left_in_the_baseline_folder() -> None:
    # measured/: the baselines; releases/: Records of real releases, the upgrade guard's and the
    # tolerance generator's input (memclaims baselines spread --changes), read by no library code.
    assert sorted(p.name for p in (ROOT / "baselines").iterdir()) == ["measured", "releases"]


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(UsageError, match="memclaims ships no file 'nope.json'; its files: published.json"):
        packaged.resource("nope.json")


def test_generators_write_the_packaged_file_in_a_checkout_or_where_told(tmp_path: Path) -> None:
    assert packaged.output_path(packaged.TOLERANCES, None, "x") == packaged.resource(packaged.TOLERANCES)
    assert packaged.output_path(packaged.TOLERANCES, tmp_path / "t.json", "x") == tmp_path / "t.json"


def _installed_in_a_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """memclaims' resources as an installed, read-only copy presents them: not a writable folder."""
    archive = tmp_path / "memclaims.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for name in packaged.NAMES:
            out.writestr(f"memclaims/resources/{name}", "{}")
    monkeypatch.setattr(packaged, "resource", lambda name: zipfile.Path(archive, f"memclaims/resources/{name}"))


def test_spread_asks_for_out_before_measuring_where_the_package_is_read_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _installed_in_a_zip(tmp_path, monkeypatch)

    def measured(*args: object) -> None:
        raise AssertionError("measured before knowing where to write")

    monkeypatch.setattr(spread, "measure_seeds", measured)
    assert cli.main(["baselines", "spread"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memclaims baselines spread: the packaged tolerances.json" in err
    assert "is not writable here; pass --out FILE" in err


