"""The baseline store and the comparison, end to end with pytester, on fake Records (no training)."""

from __future__ import annotations

import json
import multiprocessing
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from fixtures.paths import ROOT
from memclaims.baselines.compare import REGRESSION, STALE, compare
from memclaims.baselines.store import SCHEMA, BaselineError, BaselineStore
from memclaims.core.environment import environment_id
from memclaims.core.record import Record
from memclaims.pytest.testing import FAKE_PEAK, FAKE_VERSIONS, PLATEAU, fake_record, make_project

pytest_plugins = ["pytester"]

ENV = "cpu-x86_64"
NOW_VERSIONS = FAKE_VERSIONS
PEAK = FAKE_PEAK


def scaled(record: Record, factor: float, **changes: Any) -> Record:
    """The same Record with every memory figure scaled, as an older baseline would hold it."""
    raw = record.to_dict()
    for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes", "load_peak_bytes", "peak_allocated_bytes"):
        raw[key] = int(round(raw[key] * factor))
    raw.update(changes)
    return Record.from_dict(raw)


# --- the throwaway project --------------------------------------------------------------------

INNER_TEST = """
import json, pathlib, pytest
from memclaims.core.record import Record

HERE = pathlib.Path(__file__).parent
NAMES = sorted(p.stem for p in HERE.glob("rec_*.json"))

@pytest.mark.parametrize("name", NAMES)
def test_case(name, baseline_check, record_property):
    raw = json.loads((HERE / (name + ".json")).read_text())
    baseline_check.check("cpu:" + raw["recipe"], Record.from_dict(raw), record_property)
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    make_project(pytester, ROOT).makepyfile(test_fake=INNER_TEST)
    return pytester


def add_case(project: pytest.Pytester, name: str, record: Record) -> None:
    (project.path / f"rec_{name}.json").write_text(record.to_json())


def store(project: pytest.Pytester) -> BaselineStore:
    return BaselineStore(project.path / "baselines")  # the default: baselines/ in the rootdir


def output(result: pytest.RunResult) -> str:
    return "\n".join(result.outlines + result.errlines)


# --- comparisons through pytest ---------------------------------------------------------------

def test_upgrade_that_grows_memory_fails_with_a_complete_message(project: pytest.Pytester) -> None:
    now = fake_record()
    add_case(project, "a", now)
    old_versions = dict(NOW_VERSIONS, torch="2.13.0")
    store(project).store_record(scaled(now, 0.9, versions=old_versions))  # baseline: 10 % less memory
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = output(result)
    baseline_peak = int(round(PEAK * 0.9))
    expected = (f"cpu:vit-smoke/fake-a: peak_allocated_bytes got worse than its baseline: "
                f"baseline {baseline_peak:,} B (9.00 MiB), now {PEAK:,} B (10.00 MiB), "
                f"change +11.11 % (tolerance +0.50 %)")
    assert expected in text
    assert "torch 2.13.0 -> 2.14.1" in text
    assert "lightning unchanged" in text
    for metric in ("load_peak_bytes", "optimizer_state_bytes", "param_bytes", "grad_bytes"):
        assert f"fake-a: {metric} got worse" in text
    assert "accuracy got worse" not in text
    # The end-of-run table names the case, the metric and the verdict.
    result.stdout.re_match_lines([r".*memclaims baselines.*", r"cpu:vit-smoke/fake-a\s+cpu-x86_64\s+"
                                  r"peak_allocated_bytes\s+9\.00 MiB\s+10\.00 MiB\s+\+11\.11 %\s+regression"])


def test_less_memory_is_stale_and_fails_only_when_strict(project: pytest.Pytester) -> None:
    now = fake_record()
    add_case(project, "a", now)
    store(project).store_record(scaled(now, 1.1))  # baseline: 10 % more memory
    relaxed = project.runpytest("-p", "no:cacheprovider")
    relaxed.assert_outcomes(passed=1)
    relaxed.stdout.re_match_lines([r"cpu:vit-smoke/fake-a\s+cpu-x86_64\s+peak_allocated_bytes\s+11\.00 MiB\s+"
                                   r"10\.00 MiB\s+-9\.09 %\s+stale"])
    strict = project.runpytest("-p", "no:cacheprovider", "--memclaims-strict")
    strict.assert_outcomes(failed=1)
    assert "peak_allocated_bytes is better than its baseline (stale baseline" in output(strict)


def test_accuracy_fails_only_when_it_drops(project: pytest.Pytester) -> None:
    add_case(project, "a", fake_record(accuracy=0.50, accuracy_schedule=PLATEAU))
    store(project).store_record(fake_record(accuracy=0.60))
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert ("accuracy got worse than its baseline: baseline 60.00 %, now 50.00 %, change -10.00 points "
            "(tolerance -2.00 points)") in output(result)
    add_case(project, "a", fake_record(accuracy=0.50))  # short of its plateau: reported only
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_step_time_fails_only_above_the_users_threshold(project: pytest.Pytester) -> None:
    add_case(project, "a", fake_record(step_time_s=0.15))
    store(project).store_record(fake_record(step_time_s=0.10))
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = project.runpytest("-p", "no:cacheprovider", "--memclaims-time-threshold", "20")
    result.assert_outcomes(failed=1)
    assert "step_time_s got worse than its baseline: baseline 100.0 ms, now 150.0 ms, change +50.00 %" in output(result)


def test_first_run_keeps_its_measurements_and_accepts_them_without_rerunning(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from memclaims.cli import main

    add_case(project, "a", fake_record())
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "no baseline for 'vit-smoke/fake-a'" in output(result)
    assert f"accept it with `memclaims baselines accept {ENV}`" in output(result)
    s = store(project)
    assert not s.path(ENV).exists()
    assert s.path(ENV + ".obtained").exists()  # what the first run measured is kept

    monkeypatch.chdir(project.path)
    assert main(["baselines", "accept", ENV]) == 0
    assert not s.path(ENV + ".obtained").exists()
    assert BaselineStore(s.root).get(ENV, "vit-smoke/fake-a").record == fake_record()
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert main(["baselines", "accept", ENV]) == 2  # nothing left to accept: one clear line


def test_update_refuses_to_absorb_a_regression_unless_told(project: pytest.Pytester) -> None:
    now = fake_record()
    add_case(project, "a", now)
    s = store(project)
    s.store_record(scaled(now, 0.5))
    before = s.path(ENV).read_bytes()
    refused = project.runpytest("-p", "no:cacheprovider", "--update-baselines")
    refused.assert_outcomes(failed=1)
    text = output(refused)
    assert "cpu:vit-smoke/fake-a: --update-baselines refuses to absorb a regression" in text
    assert f"peak_allocated_bytes: {PEAK // 2:,} B (5.00 MiB) -> {PEAK:,} B (10.00 MiB) (+100.00 %)" in text
    assert "--memclaims-accept-regressions" in text
    assert s.path(ENV).read_bytes() == before  # nothing stored
    refused.stdout.re_match_lines([r"cpu:vit-smoke/fake-a\s+cpu-x86_64\s+peak_allocated_bytes\s+5\.00 MiB\s+"
                                   r"10\.00 MiB\s+\+100\.00 %\s+refused"])
    accepted = project.runpytest("-p", "no:cacheprovider", "--update-baselines", "--memclaims-accept-regressions")
    accepted.assert_outcomes(passed=1)
    accepted.stdout.re_match_lines([r"cpu:vit-smoke/fake-a\s+cpu-x86_64\s+peak_allocated_bytes\s+5\.00 MiB\s+"
                                    r"10\.00 MiB\s+\+100\.00 %\s+regression"])
    assert BaselineStore(s.root).get(ENV, "vit-smoke/fake-a").record.peak_allocated_bytes == PEAK


def test_update_shows_old_and_new_of_an_improvement(project: pytest.Pytester) -> None:
    now = fake_record()
    add_case(project, "a", now)
    store(project).store_record(scaled(now, 1.25))
    result = project.runpytest("-p", "no:cacheprovider", "--update-baselines")
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"cpu:vit-smoke/fake-a\s+cpu-x86_64\s+peak_allocated_bytes\s+12\.50 MiB\s+"
                                  r"10\.00 MiB\s+-20\.00 %\s+stale"])


def test_update_rewrites_only_the_cases_that_ran(project: pytest.Pytester) -> None:
    a, b = fake_record("vit-smoke/fake-a"), fake_record("vit-smoke/fake-b")
    add_case(project, "a", a)
    add_case(project, "b", b)
    s = store(project)
    s.store_record(scaled(a, 0.5))
    s.store_record(scaled(b, 0.5))
    before = json.loads(s.path(ENV).read_text())
    result = project.runpytest("-p", "no:cacheprovider", "--update-baselines", "--memclaims-accept-regressions",
                               "-k", "rec_a")
    result.assert_outcomes(passed=1, deselected=1)
    after = json.loads(s.path(ENV).read_text())
    assert after["records"]["vit-smoke/fake-a"]["record"]["peak_allocated_bytes"] == PEAK
    assert after["records"]["vit-smoke/fake-b"] == before["records"]["vit-smoke/fake-b"]
    # Now fake-a compares clean and fake-b still regresses.
    again = project.runpytest("-p", "no:cacheprovider")
    again.assert_outcomes(passed=1, failed=1)


def test_summary_json_and_junit_properties(project: pytest.Pytester) -> None:
    now = fake_record()
    add_case(project, "a", now)
    store(project).store_record(now)
    summary, junit = project.path / "summary.json", project.path / "junit.xml"
    result = project.runpytest("-p", "no:cacheprovider", f"--memclaims-summary-json={summary}",
                               f"--junitxml={junit}")
    result.assert_outcomes(passed=1)
    rows = json.loads(summary.read_text())["rows"]
    peak = next(r for r in rows if r["metric"] == "peak_allocated_bytes")
    assert peak == {**peak, "case": "cpu:vit-smoke/fake-a", "baseline": PEAK, "now": PEAK, "verdict": "ok"}
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["peak_allocated_bytes"] == str(PEAK) and props["baseline_verdict"] == "ok"


# --- files that cannot be trusted -------------------------------------------------------------

def _good_file(tmp_path: Path) -> tuple[BaselineStore, Path]:
    s = BaselineStore(tmp_path)
    s.store_record(fake_record())
    return s, s.path(ENV)


def _corruptions(text: str) -> dict[str, tuple[str, str]]:
    data = json.loads(text)
    newer = dict(data, schema=3)
    wrong_bytes = json.loads(text)
    wrong_bytes["records"]["vit-smoke/fake-a"]["record"]["peak_allocated_bytes"] = "10 MiB"
    wrong_records = dict(data, records=[])
    wrong_tol = json.loads(text)
    wrong_tol["records"]["vit-smoke/fake-a"]["tolerances"] = {"accuracy": "two points"}
    return {
        "truncated": (text[: len(text) // 2], "not valid JSON"),
        "not-json": ("<<<<<<< HEAD\n", "not valid JSON"),
        "newer-schema": (json.dumps(newer), "schema 3 is newer than this memclaims reads (schema 2)"),
        "wrong-bytes": (json.dumps(wrong_bytes),
                        "records['vit-smoke/fake-a'].record.peak_allocated_bytes must be int, found str"),
        "wrong-records": (json.dumps(wrong_records), "'records' must be an object, found list"),
        "wrong-tolerance": (json.dumps(wrong_tol), "tolerances must map metric names to numbers"),
    }


@pytest.mark.parametrize("kind", ["truncated", "not-json", "newer-schema", "wrong-bytes", "wrong-records",
                                  "wrong-tolerance"])
def test_untrustworthy_file_raises_and_stays_byte_identical(tmp_path: Path, kind: str) -> None:
    _, path = _good_file(tmp_path)
    text, expected = _corruptions(path.read_text())[kind]
    path.write_text(text)
    original = path.read_bytes()
    fresh = BaselineStore(tmp_path)
    with pytest.raises(BaselineError) as raised:
        fresh.load(ENV)
    assert str(path) in str(raised.value) and expected in str(raised.value)
    with pytest.raises(BaselineError):  # a write must not "repair" it by overwriting
        fresh.store_record(fake_record("vit-smoke/fake-b"))
    assert path.read_bytes() == original


def test_truncated_file_fails_the_case_with_the_clear_error(project: pytest.Pytester) -> None:
    add_case(project, "a", fake_record())
    s = store(project)
    s.store_record(fake_record())
    path = s.path(ENV)
    path.write_bytes(path.read_bytes()[:100])
    original = path.read_bytes()
    for extra in ((), ("--update-baselines",)):
        result = project.runpytest("-p", "no:cacheprovider", *extra)
        result.assert_outcomes(failed=1)
        assert f"baseline file {path}: not valid JSON" in output(result)
        assert "During handling" not in output(result)  # the message once, not chained to itself
        assert path.read_bytes() == original


def test_an_unwritable_baseline_folder_is_one_line_and_never_updated(project: pytest.Pytester) -> None:
    add_case(project, "a", fake_record())
    (project.path / "a-file").write_text("")  # a folder under a file cannot be made, by root either
    result = project.runpytest("-p", "no:cacheprovider", "--update-baselines", "--memclaims-summary=all",
                               "--memclaims-baselines-dir=a-file/baselines")
    result.assert_outcomes(failed=1)
    text = output(result)
    assert "a-file/baselines/measured/cpu-x86_64.json: cannot be written" in text
    assert "writable" in text and "Traceback" not in text and "OSError" not in text, text
    assert not re.search(r"\bupdated\b", text)  # the end-of-run table claims no write that failed


def test_a_lock_that_cannot_be_taken_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    def read_only(fd: int, operation: int) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fcntl, "flock", read_only)  # what a read-only mount answers (root included)
    with pytest.raises(BaselineError) as raised:
        BaselineStore(tmp_path).store_record(fake_record())
    message = str(raised.value)
    assert "\n" not in message and "Read-only file system" in message and str(tmp_path / "measured") in message


# --- the file format and concurrent writers ---------------------------------------------------

def test_file_is_sorted_indented_json_with_integer_bytes(tmp_path: Path) -> None:
    _, path = _good_file(tmp_path)
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["schema"] == SCHEMA and data["environment"] == ENV == path.stem
    entry = data["records"]["vit-smoke/fake-a"]
    assert isinstance(entry["record"]["peak_allocated_bytes"], int)
    assert entry["record"]["versions"]["torch"] == "2.14.1"
    assert entry["tolerances"] == {}  # only overrides are stored: a new default reaches every baseline


AVX2 = {"machine": "x86_64", "capability": "avx2", "half_features": [], "torch_build": "cu130"}
AVX512_BF16 = {"machine": "x86_64", "capability": "avx512", "half_features": ["amx", "bf16"],
               "torch_build": "cu130"}


def test_environment_ids() -> None:
    assert environment_id(fake_record()) == "cpu-x86_64"  # a Record from before classes were recorded
    assert environment_id(fake_record(environment=AVX2)) == "cpu-x86_64-avx2-cu130"
    assert environment_id(fake_record(environment=AVX512_BF16)) == "cpu-x86_64-avx512-amx-bf16-cu130"
    h200 = {"gpu": "NVIDIA H200", "cuda": "13.0", "cudnn": 91200}
    assert environment_id(fake_record(device="cuda", environment=h200)) == "nvidia-h200-cuda13.0-cudnn91200"
    assert environment_id(fake_record(device="cuda", device_name="NVIDIA H200")) == "nvidia-h200"
    assert environment_id(fake_record(device="sim", device_name="sim"), profile="article") == "sim-article"


def test_this_machines_class_is_what_aten_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    code = "from memclaims.core.environment import cpu_capability; print(cpu_capability())"
    env = {**__import__("os").environ, "ATEN_CPU_CAPABILITY": "default"}
    forced = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert forced.stdout.strip() == "default"


def test_a_sibling_class_is_compared_and_the_difference_said(project: pytest.Pytester) -> None:
    now = fake_record(environment=AVX2, accuracy=0.50, accuracy_schedule=PLATEAU)
    add_case(project, "a", now)
    store(project).store_record(fake_record(environment=AVX512_BF16, accuracy=0.60))
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = output(result)
    assert "got worse than its baseline: baseline 60.00 %, now 50.00 %" in text
    assert "baseline from avx512 with amx, bf16 (cu130), this machine avx2 (cu130)" in text
    result.stdout.re_match_lines([r"cpu:vit-smoke/fake-a\s+cpu-x86_64-avx512-amx-bf16-cu130\s+accuracy.*regression"])
    # Its own class wins over a sibling once it exists.
    store(project).store_record(now)
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_measured_accuracy_tolerance_applies(project: pytest.Pytester) -> None:
    add_case(project, "a", fake_record(accuracy=0.55, accuracy_schedule=PLATEAU))
    store(project).store_record(fake_record(accuracy=0.60))
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)  # default: 2 points
    (project.path / "baselines" / "tolerances.json").write_text(json.dumps(
        {"schema": 1, "accuracy": {"recipes": {"vit-smoke/fake-a": {"same": 0.06, "change": 0.08}}}}))
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    (project.path / "baselines" / "tolerances.json").write_text("{")
    broken = project.runpytest("-p", "no:cacheprovider")
    broken.assert_outcomes(failed=1)
    assert "tolerance file" in output(broken) and "tolerances.json: cannot be read" in output(broken)


def test_table_shows_what_is_not_ok_worst_first_and_everything_under_v(project: pytest.Pytester) -> None:
    s = store(project)
    for name, factor in (("a", 1.0), ("b", 0.95), ("c", 0.5)):
        record = fake_record(f"vit-smoke/fake-{name}")
        add_case(project, name, record)
        s.store_record(scaled(record, factor))
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    import re

    def table(run: pytest.RunResult) -> list[str]:
        return [line for line in run.outlines if re.match(r"cpu:vit-smoke/fake-\w\s+cpu-x86_64\s", line)]

    rows = table(result)
    assert rows[0].startswith("cpu:vit-smoke/fake-c") and "+100.00 %" in rows[0]
    assert rows[-1].startswith("cpu:vit-smoke/fake-b") and "+5.26 %" in rows[-1]
    assert not any(line.startswith("cpu:vit-smoke/fake-a") for line in rows)  # all ok: not shown
    assert any(line.startswith("cpu:vit-smoke/fake-a") and line.rstrip().endswith("ok")
               for line in table(project.runpytest("-p", "no:cacheprovider", "-v")))


def test_phase_peaks_are_compared_and_a_vanished_metric_fails() -> None:
    phases = {"optimizer_step": {"allocated_bytes": PEAK, "above_start_bytes": 4000, "reserved_bytes": None}}
    base = fake_record(phases=phases)
    grown = fake_record(phases={"optimizer_step": dict(phases["optimizer_step"], allocated_bytes=PEAK * 2,
                                                       above_start_bytes=6000)})
    result = compare(grown, base, case_id="cpu:vit-smoke/fake-a")
    assert [(r.metric, r.phase) for r in result.failures] == [("phases.optimizer_step.allocated_bytes",
                                                                "optimizer_step")]
    # The peak above the phase's start is derived: named as the explanation of the failure, never one alone.
    assert ("cpu:vit-smoke/fake-a: phases.optimizer_step.above_start_bytes got worse than its baseline, explaining "
            "the failures above: baseline 4,000 B (0.0038 MiB), now 6,000 B (0.0057 MiB), change +50.00 %") in result.message()
    later = fake_record(phases={"optimizer_step": dict(phases["optimizer_step"], above_start_bytes=6000)})
    assert not compare(later, base).failures  # the same peak from a lower start: nothing used more
    vanished = compare(fake_record(phases={}), base)
    assert {r.metric for r in vanished.failures} == {"phases.optimizer_step.allocated_bytes"}
    assert "was not measured, but the baseline has it" in vanished.message()
    gone = compare(fake_record(accuracy=None), fake_record())
    assert [r.metric for r in gone.failures] == ["accuracy"]
    fresh = compare(fake_record(phases=phases), fake_record())  # new metrics: reported, not failed
    assert not fresh.failures and fresh.verdict == "new"


def test_ranks_of_a_sharded_run_have_keys_of_their_own(tmp_path: Path) -> None:
    s = BaselineStore(tmp_path)
    ranks = [fake_record("vit-smoke/fsdp", devices=2, rank=r, optimizer_state_bytes=4000 - r) for r in (0, 1)]
    for record in ranks:
        s.store_record(record)
    fresh = BaselineStore(tmp_path)
    assert set(fresh.load(ENV)) == {"vit-smoke/fsdp@2/rank0", "vit-smoke/fsdp@2/rank1"}
    assert fresh.get(ENV, "vit-smoke/fsdp@2/rank1").record.optimizer_state_bytes == 3999
    # A rank's Record filed under the bare recipe id is caught, naming the key it belongs under.
    data = json.loads(s.path(ENV).read_text())
    data["records"]["vit-smoke/fsdp"] = data["records"].pop("vit-smoke/fsdp@2/rank0")
    s.path(ENV).write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=r"belongs under 'vit-smoke/fsdp@2/rank0'"):
        BaselineStore(tmp_path).load(ENV)


def _writer(root: str, prefix: str, count: int) -> None:
    s = BaselineStore(root)
    for i in range(count):
        s.store_record(fake_record(f"vit-smoke/{prefix}-{i}", peak_allocated_bytes=PEAK + i))


def test_two_processes_writing_at_once_both_survive(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_writer, args=(str(tmp_path), name, 25)) for name in ("left", "right")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    stored = BaselineStore(tmp_path).load(ENV)
    assert sorted(stored) == sorted(f"vit-smoke/{p}-{i}" for p in ("left", "right") for i in range(25))
    assert stored["vit-smoke/right-24"].record.peak_allocated_bytes == PEAK + 24
    assert not list(tmp_path.glob("measured/*.tmp"))  # no temp file left behind


# --- comparison rules, directly ---------------------------------------------------------------

def test_memory_tolerance_boundary_and_directions() -> None:
    base = fake_record()
    within = compare(fake_record(peak_allocated_bytes=int(PEAK * 1.004)), base)
    assert not within.failures
    beyond = compare(fake_record(peak_allocated_bytes=int(PEAK * 1.006)), base)
    assert [r.metric for r in beyond.failures] == ["peak_allocated_bytes"] and beyond.verdict == REGRESSION
    better = compare(fake_record(peak_allocated_bytes=int(PEAK * 0.9)), base)
    assert better.verdict == STALE and not better.failures
    override = compare(fake_record(peak_allocated_bytes=int(PEAK * 1.05)), base, {"peak_allocated_bytes": 0.1})
    assert not override.failures
    env = compare(fake_record(), fake_record(versions=dict(NOW_VERSIONS, lightning="2.5.0")))
    assert "lightning 2.5.0 -> 2.6.6" in env.environment_change and "torch unchanged" in env.environment_change


def test_published_numbers_are_stored_as_data() -> None:
    from memclaims.core import packaged
    from memclaims.core.published import load_published

    data = load_published(packaged.resource(packaged.PUBLISHED))
    chain = {row["script"]: row for row in data["vit_chain"]}
    assert (chain["06_sgd-with-scheduler"]["peak_reserved_gb"], chain["01-2_pytorch-fabric"]["time_min"]) == (2.02, 17.88)
    assert all(row["source"] for row in data["vit_chain"] + data["multi_gpu"] + data["llm_bonus"])
    assert data["adam8bit"]["adam8bit_state_measured_bytes"] == 134_082_160


def test_diverged_run_is_stored_as_valid_json(tmp_path: Path) -> None:
    """16-true goes NaN: the Record's NaN loss is stored as null, the nan flags keep the fact."""
    nan = float("nan")
    s = BaselineStore(tmp_path)
    s.store_record(fake_record(final_loss=nan, nan_loss=True, nan_step=3, memory_losses=[2.4, nan]))
    stored = BaselineStore(tmp_path).load(ENV)["vit-smoke/fake-a"].record
    assert stored.final_loss is None and stored.nan_loss and stored.nan_step == 3
    assert stored.memory_losses == [2.4, None]


def test_a_ranks_phase_peaks_get_the_distributed_tolerance() -> None:
    phases = {"backward": {"allocated_bytes": PEAK, "above_start_bytes": 100_000, "reserved_bytes": None}}
    moved = {"backward": dict(phases["backward"], allocated_bytes=PEAK * 104 // 100)}  # +4 %, seen between two runs
    rank = {"devices": 2, "rank": 0}
    assert not compare(fake_record(phases=moved, **rank), fake_record(phases=phases, **rank)).failures
    assert compare(fake_record(phases=moved), fake_record(phases=phases)).failures  # one process: exact
    far = {"backward": dict(phases["backward"], allocated_bytes=PEAK * 115 // 100)}
    assert compare(fake_record(phases=far, **rank), fake_record(phases=phases, **rank)).failures
