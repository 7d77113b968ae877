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


@pytest.mark.parametrize(("version", "expected"), [
    ("2.9.1", "inside"), ("2.15.0", "inside"), ("2.15.0+cu128", "inside"), ("2.15.0rc1", "inside"),
    ("2.12", "inside"), ("2.15.1", "newer"), ("2.16.0.dev20250101", "newer"), ("3.0", "newer"),
    ("2.9.0", "older"), ("2.9", "older"), (None, "unknown"), ("nightly", "unknown"),
])
def test_where_a_torch_release_lies(version: str | None, expected: str) -> None:
    assert tested_versions.table()["torch"] == ("2.9.1", "2.15.0")
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


def test_the_header_says_which_releases_run_and_where_they_lie() -> None:
    inside = {"torch": "2.14.1", "torchvision": "0.29.1", "lightning": "2.6.6", "torchmetrics": "1.9.0",
              "transformers": "5.24.0", "bitsandbytes": "0.50.2"}
    (line,) = tested_versions.header_lines(inside)
    assert line.startswith("memclaims: stack torch 2.14.1, torchvision 0.29.1, lightning 2.6.6") and \
        "(each inside the tested range;" in line
    newer = tested_versions.header_lines({**inside, "torch": "2.16.0", "bitsandbytes": None})
    assert "(torch newer; bitsandbytes unknown;" in newer[0] and "bitsandbytes not installed" in newer[0]
    assert newer[1] == ("memclaims: torch 2.16.0 (newest tested 2.15.0): newer than tested; it runs, and a number "
                        "it moves fails its case naming the release")


def test_a_record_says_where_its_releases_lie_and_old_records_still_load() -> None:
    from memclaims.recipes.options import RunOptions
    from memclaims.recipes.recipe import resolve
    from memclaims.run import measure

    (record,) = measure(resolve("vit", "smoke", ("sgd",)), RunOptions(device="sim", evaluate=False, memory_steps=1))
    assert record.versions_tested == tested_versions.classify(record.versions)
    assert set(record.versions_tested) == set(tested_versions.PACKAGES)
    assert Record.from_dict(record.to_dict()).versions_tested == record.versions_tested
    committed = BaselineStore(ROOT / "baselines").load("cpu-x86_64-avx2-cu130")  # most written before the field
    assert committed and any(b.record.versions_tested == {} for b in committed.values())


def test_a_newer_release_runs_with_one_header_line(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    make_project(pytester, ROOT).makepyfile(test_x="def test_x():\n    pass\n")
    real = tested_versions.installed
    monkeypatch.setattr(tested_versions, "installed", lambda: {**real(), "lightning": "2.9.0"})
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["memclaims: stack torch *, lightning 2.9.0, * (lightning newer; tested range: *",
                                 "memclaims: lightning 2.9.0 (newest tested 2.6.6): newer than tested; it runs*"])
