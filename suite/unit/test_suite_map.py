"""suite/README.md, the map of where the test for X lives, held to the checkout: every path it names exists (the
checkout's, the suite's or the package's), and where a row names modules and ``test_<module>.py``, each of those
modules has that test file. Pure parsing (fixtures/stated_architecture.py)."""

from __future__ import annotations

from pathlib import Path

from fixtures.paths import PACKAGE, ROOT, SUITE
from fixtures.stated_architecture import readme_paths


def missing(paths: list[str], bases: tuple[Path, ...] = (ROOT, SUITE, PACKAGE)) -> list[str]:
    return sorted({path for path in paths if not any((base / path).exists() or any(base.glob(path)) for base in bases)})


def test_suite_readme_names_only_paths_that_exist() -> None:
    named = readme_paths((SUITE / "README.md").read_text())
    assert len(named) > 100, "the parser found almost no paths in suite/README.md"
    gone = missing(named)
    assert gone == [], f"suite/README.md names files that do not exist (moved or renamed? update its map): {gone}"


def test_the_parser_expands_a_rows_modules_and_follows_a_cells_folder(tmp_path: Path) -> None:
    text = ("| module | unit tests |\n|---|---|\n"
            "| `measure/probes.py`, `host.py` (+ `gone.py`) | `unit/measure/test_<module>.py`, `test_extra.py` |\n"
            "* A technique's own cases: `cases/techniques/test_<technique>.py` (`test_lora.py`,\n"
            "  `test_qlora.py`); a claim: `memclaims/resources/sources/*.json`\n")
    assert readme_paths(text) == [
        "measure/probes.py", "measure/host.py", "measure/gone.py",
        "unit/measure/test_probes.py", "unit/measure/test_host.py", "unit/measure/test_extra.py",
        "cases/techniques/test_lora.py", "cases/techniques/test_qlora.py", "memclaims/resources/sources/*.json"]
    (tmp_path / "measure").mkdir()
    (tmp_path / "measure" / "probes.py").write_text("")
    assert missing(["measure/probes.py", "measure/lora.py"], (tmp_path,)) == ["measure/lora.py"]
