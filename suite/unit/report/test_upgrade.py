"""``memclaims upgrade`` with a faked environment builder: specs, pins, uv's failures as one line,
and a candidate's Records judged against baselines into upgrade.md / upgrade.json and an exit status."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fixtures.candidates import CANDIDATE, FakeBuilder
from memclaims.baselines.store import BaselineStore
from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.pytest.testing import FAKE_PEAK, FAKE_VERSIONS, fake_record
from memclaims.report import upgrade


@pytest.mark.parametrize(("specs", "problem"), [
    ([], "needs at least one SPEC, e.g. torch==2.15.0 (or torch: its newest release), or --newest"),
    (["torch>>2"], "upgrade SPEC 'torch>>2' is not a requirement"),
    (["torch[opt-einsum]==2.15.0"], "upgrade SPEC 'torch[opt-einsum]==2.15.0': give a package and its versions only"),
])
def test_bad_specs_are_one_line(specs: list[str], problem: str) -> None:
    with pytest.raises(UsageError, match=re.escape(problem)) as caught:
        upgrade.parse_specs(specs)
    assert "\n" not in str(caught.value)


@pytest.mark.reads_versions
def test_only_what_the_specs_name_changes(installed_releases: object) -> None:
    from importlib import metadata

    wanted = upgrade.requirements(upgrade.parse_specs(["torch==2.15.0"]))
    assert wanted[0] == "torch==2.15.0" and "torchvision" in wanted  # uv picks the one built for it
    assert f"lightning=={metadata.version('lightning')}" in wanted
    assert not any(w.startswith("torch==2.14") for w in wanted)
    lightning = upgrade.requirements(upgrade.parse_specs(["Lightning==2.5.6"]))
    assert lightning[0] == "Lightning==2.5.6" and f"torch=={metadata.version('torch')}" in lightning
    assert not any(w.startswith("lightning==") for w in lightning)


@pytest.mark.parametrize(("output", "expected"), [
    ("  × No solution found when resolving dependencies:\n  ╰─▶ Because there is no version of torch==9.9.9 and you "
     "require torch==9.9.9, we can conclude that your requirements are unsatisfiable.",
     "no installable release for torch==9.9.9: Because there is no version of torch==9.9.9"),
    ("error: Failed to fetch: `https://pypi.org/simple/torch/`\n  Caused by: Request failed after 3 retries\n"
     "  Caused by: dns error: failed to lookup address information",
     "no network: could not fetch what the candidate needs (error: Failed to fetch: `https://pypi.org/simple/torch/`)"),
    ("error: something else broke", "the candidate environment could not be built: error: something else broke"),
])
def test_uvs_failures_are_one_line(output: str, expected: str) -> None:
    line = upgrade.explain_install_failure(output, ["torch==9.9.9"])
    assert line.startswith(expected) and "\n" not in line


def _line(tier: str, record: Record) -> dict[str, object]:
    return {"tier": tier, "recipe": record.recipe, "record": record.to_dict()}


def test_a_candidate_is_judged_and_reported_regressions_first(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines", tolerances=tmp_path / "no-noise-measured.json")
    for name in ("a", "b", "c"):
        store.store_record(fake_record(f"vit-smoke/{name}"))
    grown = fake_record("vit-smoke/a", peak_allocated_bytes=2 * FAKE_PEAK, versions=CANDIDATE)
    shrunk = fake_record("vit-smoke/b", peak_allocated_bytes=FAKE_PEAK // 2, versions=CANDIDATE)
    same = fake_record("vit-smoke/c", versions=CANDIDATE)
    lines = [_line("cpu", grown), _line("cpu", shrunk), _line("cpu", same),
             {"tier": "cpu", "recipe": "vit-smoke/16-mixed", "skipped": "no float16 AMP on the CPU"},
             _line("cpu", fake_record("vit-smoke/new", versions=CANDIDATE))]
    builder = FakeBuilder(lines, reseeded=0.5)
    report = upgrade.upgrade(upgrade.parse_specs(["torch==2.15.0"]), tmp_path / "out", store, builder=builder)
    assert builder.asked and builder.asked[0][0] == "torch==2.15.0"
    assert [r["case"] for r in report.regressions] == ["cpu:vit-smoke/a"]
    assert report.regressions[0]["metric"] == "peak_allocated_bytes"
    assert report.regressions[0]["changed"] == "torch 2.14.1 -> 2.15.0, torchvision 0.29.1 -> 0.29.2"
    assert "cpu:vit-smoke/b" in {r["case"] for r in report.improvements}
    assert report.counts()["cpu"]["cases"] == 3 and report.counts()["cpu"]["unchanged"] > 0
    text = (tmp_path / "out" / "upgrade.md").read_text()
    assert text.index("## Regressions") < text.index("cpu:vit-smoke/a") < text.index("## Improvements")
    assert "| cpu:vit-smoke/a | peak_allocated_bytes | 10.00 MiB | 20.00 MiB | +100.00 %" in text
    assert "cpu:vit-smoke/16-mixed: no float16 AMP on the CPU" in text
    assert "cpu:vit-smoke/new: no committed baseline" in text
    data = json.loads((tmp_path / "out" / "upgrade.json").read_text())
    assert data["specs"] == ["torch==2.15.0"] and data["regressions"][0]["case"] == "cpu:vit-smoke/a"
    assert any(line.startswith("regression: cpu:vit-smoke/a peak_allocated_bytes 10.00 MiB -> 20.00 MiB")
               for line in upgrade.summary_lines(report))


def test_a_converged_accuracy_past_its_tolerance_reruns_in_the_candidate(tmp_path: Path) -> None:
    """The candidate's worker is asked again with each stored seed; the means decide."""
    from memclaims.pytest.testing import PLATEAU

    root = tmp_path / "baselines"
    store = BaselineStore(root)
    store.store_record(fake_record("vit-converged/fabric", accuracy=0.96))
    (root / "tolerances.json").write_text(json.dumps({"schema": 1, "accuracy": {"recipes": {"vit-converged/fabric": {
        "same": 0.005, "change": 0.01, "by_seed": {"123": 0.96, "1": 0.97, "2": 0.95}}}}}))
    dropped = fake_record("vit-converged/fabric", accuracy=0.94, versions=CANDIDATE, accuracy_schedule=PLATEAU)
    for reseeded, verdict in ((0.96, "ok"), (0.90, "regression")):
        report = upgrade.upgrade(upgrade.parse_specs(["torch==2.15.0"]), tmp_path / "out", BaselineStore(root),
                                 builder=FakeBuilder([_line("converged", dropped)], reseeded))
        (comparison,) = [c for _, c in report.comparisons]
        result = next(r for r in comparison.results if r.metric == "accuracy")
        assert result.verdict == verdict and "reran with 2 more seeds (1, 2)" in result.detail, result


def test_the_command_line_exits_1_on_a_regression_and_2_on_a_bad_spec(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from memclaims.cli import main

    store = BaselineStore(tmp_path / "baselines")
    store.store_record(fake_record("vit-smoke/a"))
    (tmp_path / "baselines" / "tolerances.json").write_text('{"schema": 1}')  # no noise measured
    grown = fake_record("vit-smoke/a", peak_allocated_bytes=2 * FAKE_PEAK, versions=CANDIDATE)
    monkeypatch.setattr(upgrade, "UvBuilder", lambda progress: FakeBuilder([_line("cpu", grown)], 0.5))
    common = ["--out", str(tmp_path / "out"), "--baselines-dir", str(tmp_path / "baselines")]
    assert main(["upgrade", "torch==2.15.0", *common]) == 1
    assert "regression: cpu:vit-smoke/a peak_allocated_bytes" in capsys.readouterr().out
    assert main(["upgrade", "torch>>2", *common]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: upgrade SPEC 'torch>>2' is not a "
                                                                        "requirement")
    assert main(["upgrade", "torch==2.15.0", "--accept", *common]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --accept bumps a lock: give it with --lock FILE (e.g. --lock locks/ci.txt)"]
    assert main(["upgrade", "torch==2.15.0", "--tiers", "gpu", *common]) == 2


def test_the_worker_writes_a_line_per_case_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """python -m memclaims.report.candidate: one JSON line per Record, skipped and failed cases said, a rerun
    measuring only what the file lacks, and --only / --seed."""
    from memclaims import run as measure
    from memclaims.core.errors import MemclaimsError
    from memclaims.report import candidate

    measured: list[tuple[str, int]] = []

    def fake_measure(recipe, options):  # type: ignore[no-untyped-def]
        measured.append((recipe.id, options.seed))
        if "sgd" in recipe.id:
            raise MemclaimsError(f"{recipe.id} ran out of memory")
        return [fake_record(recipe.id)]

    monkeypatch.setattr(measure, "run_recipe", fake_measure)
    out = tmp_path / "records.jsonl"
    ids = [r.id for r, _ in candidate.cases("converged")]
    assert candidate.main(["--out", str(out), "--tiers", "converged"]) == 1  # the sgd case failed
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["recipe"] for line in lines] == ids and len(measured) == len(ids)
    assert [line["error"] for line in lines if "error" in line] == ["vit-converged/sgd ran out of memory"]
    measured.clear()
    candidate.main(["--out", str(out), "--tiers", "converged"])
    assert measured == []  # everything is in the file: nothing measured twice
    seeded = tmp_path / "seeded.jsonl"
    candidate.main(["--out", str(seeded), "--tiers", "converged", "--only", "vit-converged/fabric", "--seed", "7"])
    assert measured == [("vit-converged/fabric", 7)]
    skipped = dict(candidate.measure_case("cpu", *next((r, o) for r, o in candidate.cases("cpu")
                                                        if r.precision == "16-mixed"))[0])
    assert "bf16-mixed" in skipped["skipped"]
    with pytest.raises(SystemExit):
        candidate.main(["--out", str(out), "--tiers", "gpu"])


def test_the_release_history_marks_what_moved_and_says_why_or_that_nobody_knows(tmp_path: Path) -> None:
    from memclaims.report import releases

    def run_file(name: str, torch_version: str, load: int) -> Path:
        versions = {**FAKE_VERSIONS, "torch": torch_version}
        record = fake_record("vit-smoke/fabric", versions=versions, phases={"load": {"allocated_bytes": load}})
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps({"tier": "cpu", "recipe": record.recipe, "record": record.to_dict()}) + "\n")
        return path

    files = [run_file("b", "2.12.1", 83_112), run_file("a", "2.9.1", 78_504), run_file("c", "2.14.1", 83_112)]
    runs = releases.load(files, FAKE_VERSIONS)
    assert [r.label for r in runs] == ["torch 2.9.1", "torch 2.12.1", "this stack"]  # oldest torch first
    text = releases.markdown(runs)
    assert "| vit-smoke/fabric | load | 78,504 | **83,112** | 83,112 |" in text
    assert "- load at torch 2.12.1: fabric 78,504 -> 83,112 (+5.9 %). Why: torch's nn.init.trunc_normal_" in text
    releases.EXPLANATIONS.pop(("cpu", "load", "torch 2.12.1"))
    try:
        assert "(+5.9 %). Why: unexplained" in releases.markdown(runs)
    finally:
        import importlib

        importlib.reload(releases)
    assert releases.main([str(p) for p in files] + ["--out", str(tmp_path / "docs")]) == 0
    assert (tmp_path / "docs" / "releases.png").stat().st_size > 0
