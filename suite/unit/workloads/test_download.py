"""--memclaims-download: the wiring, with the download functions replaced (never a real download here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.pytest.testing import make_project
from memclaims.workloads import data, download

pytest_plugins = ["pytester"]


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    calls: list[tuple[str, Path]] = []

    def cifar(folder: Path) -> None:
        calls.append(("cifar10", folder))
        (folder / "cifar-10-batches-py").mkdir()

    def imdb(folder: Path) -> None:
        calls.append(("imdb", folder))
        for split in ("train", "test"):
            for label in ("pos", "neg"):
                (folder / "aclImdb" / split / label).mkdir(parents=True)

    monkeypatch.setattr(download, "fetch_cifar10", cifar)
    monkeypatch.setattr(download, "fetch_imdb", imdb)
    return calls


def _session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    make_project(pytester, ROOT).makepyfile(test_nothing="def test_nothing():\n    pass\n")
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-s", *args)


def test_download_fills_separate_folders_once(pytester, fetched, monkeypatch) -> None:
    monkeypatch.delenv("MEMCLAIMS_DATA_DIR", raising=False)
    target = pytester.path / "data"
    _session(pytester, "--memclaims-download", "--memclaims-data-dir", str(target)).assert_outcomes(passed=1)
    assert fetched == [("cifar10", target / "images"), ("imdb", target / "text")]
    # Readers find each data set in its own folder.
    assert data.kind_dir(target, "images") == target / "images" and data.kind_dir(target, "text") == target / "text"
    fetched.clear()
    result = _session(pytester, "--memclaims-download", "--memclaims-data-dir", str(target))
    assert fetched == [] and "CIFAR-10: already in" in result.stdout.str()


def test_off_by_default(pytester, fetched, monkeypatch) -> None:
    monkeypatch.delenv("MEMCLAIMS_DATA_DIR", raising=False)
    _session(pytester, "--memclaims-data-dir", str(pytester.path)).assert_outcomes(passed=1)
    assert fetched == []


def test_download_without_a_data_dir_is_a_usage_error(pytester, fetched, monkeypatch) -> None:
    monkeypatch.delenv("MEMCLAIMS_DATA_DIR", raising=False)
    result = _session(pytester, "--memclaims-download")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and fetched == []
    assert "--memclaims-download needs a folder" in result.stderr.str()


def test_a_flat_data_dir_still_works(tmp_path) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()
    assert data.kind_dir(tmp_path, "images") == tmp_path
    assert data.kind_dir(None, "images") is None
