"""The version policy: lower bounds only on the tested libraries, the tested range as package data,
and every Record and pytest header saying where the running releases lie in it."""

from __future__ import annotations

import re

import pytest

from fixtures.paths import ROOT
from memclaims.baselines.store import BaselineStore
from memclaims.core import packaged, tested_versions
from memclaims.core.record import Record
from memclaims.pytest.testing import make_project

pytest_plugins = ["pytester"]
# The tests' own tested range and release sets: what they assert must not follow the packaged file, which
# grows each time a release is recorded, nor what this machine has installed (fixtures.releases).
TABLE = {"torch": ("2.9.1", "2.15.0"), "torchvision": ("0.24.1", "0.29.2"), "lightning": ("2.5.6", "2.6.6"),
         "torchmetrics": ("1.9.0", "1.9.0"), "transformers": ("5.24.0", "5.25.0"), "bitsandbytes": ("0.50.2", "0.50.2")}
INSIDE = {"torch": "2.14.1", "torchvision": "0.29.1", "lightning": "2.6.6", "torchmetrics": "1.9.0",
          "transformers": "5.24.0", "bitsandbytes": "0.50.2"}


@pytest.fixture
def own_table(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, str]]:
    monkeypatch.setattr(tested_versions, "table", lambda: TABLE)
    return TABLE


@pytest.mark.reads_versions
@pytest.mark.parametrize(("version", "expected"), [
    ("2.9.1", "inside"), ("2.15.0", "inside"), ("2.15.0+cu128", "inside"), ("2.15.0rc1", "inside"),
    ("2.12", "inside"), ("2.15.1", "newer"), ("2.16.0.dev20250101", "newer"), ("3.0", "newer"),
    ("2.9.0", "older"), ("2.9", "older"), (None, "unknown"), ("nightly", "unknown"),
])
def test_where_a_torch_release_lies(own_table: object, installed_releases: object, version: str | None,
                                    expected: str) -> None:
    assert tested_versions.position("torch", version) == expected


def test_a_package_without_a_range_is_unknown() -> None:
    assert tested_versions.position("numpy", "2.0") == "unknown"


def test_every_tested_library_has_a_range_and_pyproject_bounds_it_from_below_only() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    text = packaged.resource(packaged.TESTED_VERSIONS).read_text()
    assert '"tested": "A release is tested when' in text  # the file says what it means
    for package in tested_versions.PACKAGES:
        lowest, highest = tested_versions.table()[package]
        assert tested_versions.position(package, lowest) == tested_versions.position(package, highest) == "inside"
        spec = re.search(rf'^    "{package}(.*)",$', pyproject, re.M)
        assert spec and re.fullmatch(r">=[\d.]+", spec.group(1)), f"{package}: {spec and spec.group(1)!r}"
        assert tested_versions.position(package, spec.group(1)[2:]) != "newer"  # the bound admits what was tested


@pytest.mark.reads_versions
def test_each_release_set_is_what_memclaims_reads_as_installed(installed_releases: dict[str, str]) -> None:
    """The fake reaches what memclaims reads (else every run under it would prove nothing), and each
    faked release lies outside the packaged range, as a release shipped overnight does."""
    from memclaims.core.record import library_versions

    read, recorded = tested_versions.installed(), library_versions()
    for package, version in installed_releases.items():
        assert read[package] == recorded[package] == version
        assert tested_versions.position(package, version) in ("newer", "older")


@pytest.mark.reads_versions
def test_the_header_says_which_releases_run_and_where_they_lie(own_table: object, installed_releases: object) -> None:
    inside = INSIDE
    (line,) = tested_versions.header_lines(inside)
    assert line.startswith("memclaims: stack torch 2.14.1, torchvision 0.29.1, lightning 2.6.6") and \
        "(each inside the tested range;" in line
    newer = tested_versions.header_lines({**inside, "torch": "2.16.0", "bitsandbytes": None})
    assert "(torch newer; bitsandbytes unknown;" in newer[0] and "bitsandbytes not installed" in newer[0]
    assert newer[1] == ("memclaims: torch 2.16.0 (newest tested 2.15.0): newer than tested; it runs, and a number "
                        "it moves fails its case naming the release")


@pytest.mark.reads_versions
def test_a_record_says_where_its_releases_lie_and_old_records_still_load(installed_releases: dict[str, str]) -> None:
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    (record,) = run_recipe(resolve("vit", "smoke", ("sgd",)), RunOptions(device="sim", evaluate=False, memory_steps=1))
    assert record.versions_tested == tested_versions.classify(record.versions)
    assert {p: record.versions[p] for p in installed_releases} == installed_releases  # the Record reads the installed
    assert set(record.versions_tested) == set(tested_versions.PACKAGES)
    assert Record.from_dict(record.to_dict()).versions_tested == record.versions_tested
    committed = BaselineStore(ROOT / "baselines").load("cpu-x86_64-avx2-cu130")  # most written before the field
    assert committed and any(b.record.versions_tested == {} for b in committed.values())


@pytest.mark.reads_versions
def test_a_newer_release_runs_with_one_header_line(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                   own_table: object, installed_releases: object) -> None:
    make_project(pytester, ROOT).makepyfile(test_x="def test_x():\n    pass\n")
    monkeypatch.setattr(tested_versions, "installed", lambda: {**INSIDE, "lightning": "2.9.0"})
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["memclaims: stack torch *, lightning 2.9.0, * (lightning newer; tested range: *",
                                 "memclaims: lightning 2.9.0 (newest tested 2.6.6): newer than tested; it runs*"])
