"""Diagnosis of memory failures: the breakdown JSON (every tier) and the CUDA snapshot (fake cuda)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.paths import ROOT
from memclaims.core.record import Record
from memclaims.measure import diagnosis
from memclaims.measure.probes import CudaProbe
from memclaims.pytest.testing import CHECKOUT_CONFTEST, make_project

pytest_plugins = ["pytester"]
CASE = "cpu:vit-smoke/bf16-true"


class FakeCudaMemory:
    def __init__(self) -> None:
        self.history_calls: list[dict[str, Any]] = []
        self.dumps: list[str] = []

    def _record_memory_history(self, **kwargs: Any) -> None:
        self.history_calls.append(kwargs)

    def _dump_snapshot(self, path: str) -> None:
        self.dumps.append(path)
        Path(path).write_bytes(b"fake snapshot")


class FakeCuda:
    """The parts of torch.cuda that CudaProbe.prepare and memclaims.measure.diagnosis call."""

    def __init__(self) -> None:
        self.memory = FakeCudaMemory()

    def synchronize(self) -> None: ...
    def empty_cache(self) -> None: ...
    def reset_peak_memory_stats(self) -> None: ...


def test_case_ids_become_safe_file_names() -> None:
    assert diagnosis.case_file_stem("gpu:vit-article/bf16-true+sgd") == "gpu-vit-article-bf16-true+sgd"
    assert diagnosis.case_file_stem("test_x[cpu:a/b]") == "test_x-cpu-a-b"
    assert "/" not in diagnosis.case_file_stem("../../etc/passwd")


def test_cuda_probe_records_a_bounded_history_only_when_asked() -> None:
    cuda = FakeCuda()
    CudaProbe(cuda, history_entries=5000).prepare()
    # Earlier cases' history is dropped first, then recording restarts with the bound.
    assert cuda.memory.history_calls == [{"enabled": None}, {"max_entries": 5000}]
    quiet = FakeCuda()
    CudaProbe(quiet, history_entries=0).prepare()
    CudaProbe(quiet).prepare()  # an injected fake never inherits the session's setting
    assert quiet.memory.history_calls == []


# --- end to end: the baseline check saves the diagnosis on memory failures only ----------------

FAKE_CASES = """
import json, pathlib, pytest
from memclaims.core.record import Record

HERE = pathlib.Path(__file__).parent

class FakeMemory:
    def __init__(self, recipe):
        self.recipe = recipe

    def _snapshot(self):
        return {"segments": [], "device_traces": [[{"action": "alloc", "recipe": self.recipe}]]}


class FakeCuda:
    def __init__(self, recipe):
        self.memory = FakeMemory(recipe)


@pytest.fixture(scope="module", autouse=True)
def recipes_ran():
    # As the record cache does: every recipe runs (and captures its snapshot) before any check.
    from memclaims.measure import diagnosis

    for name in ("grows", "same"):
        diagnosis.capture_snapshot(FakeCuda("vit-article/" + name), "vit-article/" + name)


@pytest.mark.parametrize("name", ["grows", "same"])
def test_case(name, baseline_check, record_property):
    raw = json.loads((HERE / "record.json").read_text())
    raw["recipe"] = "vit-article/" + name
    if name == "grows":
        raw["peak_allocated_bytes"] = int(raw["peak_allocated_bytes"] * 1.2)
        raw["breakdown"]["activations_and_temporaries"] += 1000
    baseline_check.check("gpu:vit-article/" + name, Record.from_dict(raw), record_property)
"""


def _cuda_record(recipe: str) -> dict[str, Any]:
    return dict(recipe=recipe, workload="vit", scale="article", techniques=["bf16-true"], device="cuda",
                device_name="nvidia-fake", probe="cuda", precision="bf16-true", batch_size=64,
                accumulation_steps=1, memory_steps=2, param_count=100, param_tensor_count=2, param_bytes=200,
                grad_bytes=200, optimizer_state_bytes=0, load_peak_bytes=300, peak_allocated_bytes=10_000,
                peak_reserved_bytes=20_000, accuracy=None, final_loss=1.0, nan_loss=False, nan_step=None,
                step_time_s=0.1, weights="random", data="sklearn-digits", versions={"torch": "2.14.1"},
                breakdown={"parameters": 200, "gradients": 200, "optimizer_state": 0,
                           "activations_and_temporaries": 9_600})


def test_cuda_snapshot_of_the_failing_recipe_is_saved_on_memory_failure_only(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    fake = FakeCudaMemory()
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", fake._dump_snapshot)
    make_project(pytester, ROOT)
    pytester.makepyfile(test_fake=FAKE_CASES)
    from memclaims.baselines.store import Baseline, BaselineStore

    store = BaselineStore(pytester.path / "baselines")
    store.update("nvidia-fake", {name: Baseline(Record(**_cuda_record(name)))
                                 for name in ("vit-article/grows", "vit-article/same")})
    (pytester.path / "record.json").write_text(json.dumps(_cuda_record("x")))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--memclaims-memory-history", "1000")
    result.assert_outcomes(passed=1, failed=1)
    artifacts = pytester.path / "memclaims-results"
    assert fake.dumps == []  # nothing is dumped at check time: the history then is another case's
    import pickle

    saved = pickle.loads((artifacts / "gpu-vit-article-grows.snapshot.pickle").read_bytes())
    assert saved["device_traces"] == [[{"action": "alloc", "recipe": "vit-article/grows"}]]
    assert sorted(p.name for p in artifacts.iterdir()) == ["gpu-vit-article-grows.breakdown.json",
                                                           "gpu-vit-article-grows.snapshot.pickle"]
    report = json.loads((artifacts / "gpu-vit-article-grows.breakdown.json").read_text())
    assert report["breakdown"]["activations_and_temporaries"] == {
        "baseline_bytes": 9_600, "now_bytes": 10_600, "change_bytes": 1_000}
    result.stdout.fnmatch_lines(["*diagnosis saved: *gpu-vit-article-grows.breakdown.json, "
                                 "*gpu-vit-article-grows.snapshot.pickle*"])
    # With history off there is nothing to dump: the breakdown alone is saved.
    fake.dumps.clear()
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--memclaims-memory-history", "0",
                                 "--memclaims-artifacts", "quiet").assert_outcomes(passed=1, failed=1)
    assert fake.dumps == []
    assert [p.name for p in (pytester.path / "quiet").iterdir()] == ["gpu-vit-article-grows.breakdown.json"]


# --- the CPU tier for real: a trained case against a baseline edited to 10 % less memory ------

# In-process pytester unloads, when it ends, every module first imported while it was alive; a
# training run imports torch modules that register torch libraries, which cannot be imported twice
# in one process (later tests would fail). Import them before pytester takes its snapshot.
_TRAINING_IMPORTS = ("lightning.fabric", "torch.distributed._tools.mem_tracker", "torchvision", "torch._dynamo",
                     "torch._inductor.test_operators", "torch.distributed.fsdp", "torch.distributed.tensor",
                     "torch.export", "torch.onnx", "torch.utils.flop_counter", "torch.sparse", "torch._prims",
                     "torch.utils._debug_mode", "memclaims.measure.runner")


@pytest.fixture(scope="module")
def training_imports() -> None:
    for name in _TRAINING_IMPORTS:
        importlib.import_module(name)


def test_cpu_case_failing_on_memory_saves_both_breakdowns(training_imports: None, pytester: pytest.Pytester) -> None:
    make_project(pytester, ROOT)
    # A basename of its own: the outer session may already have imported suite/cases/test_technique_matrix.py.
    pytester.makepyfile(test_memory_case=(ROOT / "suite" / "cases" / "test_technique_matrix.py").read_text())
    node = f"test_memory_case.py::test_case[{CASE}]"
    common = ("-p", "no:cacheprovider", "--memclaims-steps", "1", "--memclaims-baselines-dir", "b")
    pytester.runpytest_inprocess(node, *common, "--update-baselines").assert_outcomes(passed=1)
    path = next((pytester.path / "b" / "measured").glob("*.json"))
    data = json.loads(path.read_text())
    entry = data["records"]["vit-smoke/bf16-true"]["record"]
    measured = dict(entry["breakdown"])
    for key in ("peak_allocated_bytes", "load_peak_bytes"):
        entry[key] = int(entry[key] * 0.9)
    entry["breakdown"] = {k: int(v * 0.9) for k, v in measured.items()}
    path.write_text(json.dumps(data, indent=2, sort_keys=True))

    result = pytester.runpytest_inprocess(node, *common)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak_allocated_bytes got worse than its baseline*", "*diagnosis saved:*"])
    report = json.loads((pytester.path / "memclaims-results" / "cpu-vit-smoke-bf16-true.breakdown.json").read_text())
    assert report["failing_metrics"] == ["load_peak_bytes", "peak_allocated_bytes"]
    for category in ("parameters", "activations_and_temporaries"):
        row = report["breakdown"][category]
        assert row["now_bytes"] == measured[category] and row["baseline_bytes"] == int(measured[category] * 0.9)
    assert not list((pytester.path / "memclaims-results").glob("*.snapshot.pickle")), "no snapshot on the CPU"


# --- out-of-memory cases are listed at the end of the run -----------------------------------

OOM_CONFTEST = CHECKOUT_CONFTEST + """
import dataclasses
import memclaims.pytest.records
from memclaims.core.errors import OutOfMemory
from memclaims.core.record import Record

def fake_measure(recipe, options):
    if "sgd" in recipe.techniques:
        raise OutOfMemory(recipe.id, options.device, "train", 123_456_789, "CPU out of memory (fake)")
    return [Record(**{f.name: None for f in dataclasses.fields(Record)} | {"recipe": recipe.id, "by_technique": {}})]

memclaims.pytest.records.run_recipe = fake_measure
"""
OOM_TESTS = """
import pytest

@pytest.mark.parametrize("technique", ["sgd", "bf16-true"])
def test_case(technique, record_cache):
    recipe = record_cache.recipe("cpu", "vit", (technique,))
    assert record_cache.get("cpu", recipe).recipe == recipe.id
"""


def test_out_of_memory_case_is_listed_and_the_session_goes_on(pytester: pytest.Pytester) -> None:
    import memclaims.pytest.records

    make_project(pytester, ROOT, conftest=OOM_CONFTEST)
    pytester.makepyfile(test_oom=OOM_TESTS)
    real_measure = memclaims.pytest.records.run_recipe
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--memclaims-summary-json", "s.json")
    finally:
        memclaims.pytest.records.run_recipe = real_measure  # the conftest patched the shared module
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "vit-smoke/sgd ran out of memory on cpu in the train phase while allocating 123456789 B*",
        "*memclaims: out of memory*",
        "cpu:vit-smoke/sgd  phase train  requested 123,456,789 B"])
    assert "Traceback" not in result.stdout.str() and "During handling" not in result.stdout.str()
    data = json.loads((pytester.path / "s.json").read_text())
    assert data["out_of_memory"] == [{"case": "cpu:vit-smoke/sgd", "phase": "train",
                                      "requested_bytes": 123_456_789}]


def test_nested_session_restores_the_history_setting(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(CHECKOUT_CONFTEST)
    pytester.syspathinsert(ROOT)
    pytester.makepyfile(test_x="""
        from memclaims.measure import diagnosis
        def test_x():
            assert diagnosis.history_entries() == 1234
    """)
    before = diagnosis.history_entries()
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--memclaims-memory-history", "1234").assert_outcomes(passed=1)
    assert diagnosis.history_entries() == before


def test_snapshots_are_bounded_in_bytes_keeping_the_latest_events() -> None:
    import pickle

    events = [{"action": "alloc", "addr": i, "size": 512, "frames": [{"filename": "x.py", "line": i}] * 20}
              for i in range(5000)]
    blocks = [{"size": 512, "addr": j, "frames": [{"filename": "y.py", "line": j, "depth": d} for d in range(10)]}
              for j in range(100)]
    snapshot = {"segments": [{"blocks": blocks}],
                "device_traces": [events]}
    assert len(pickle.dumps(snapshot)) > 200_000
    data = diagnosis.bounded_snapshot(snapshot, 200_000)
    assert len(data) <= 200_000
    kept = pickle.loads(data)
    assert kept["device_traces"][0] and kept["device_traces"][0][-1]["addr"] == 4999  # the newest survive
    assert "memclaims_truncated" in kept
    tiny_data = diagnosis.bounded_snapshot(snapshot, 5_000)
    assert len(tiny_data) <= 5_000
    tiny = pickle.loads(tiny_data)
    assert tiny["device_traces"] == [[]] and "frames" not in tiny["segments"][0]["blocks"][0]
    assert diagnosis.bounded_snapshot({"segments": []}, 10**6) == pickle.dumps({"segments": []})


def test_snapshot_is_captured_per_recipe_only_with_history_and_a_folder(tmp_path, monkeypatch) -> None:
    class Memory:
        def _snapshot(self):
            return {"segments": [], "device_traces": []}

    class Cuda:
        memory = Memory()

        def synchronize(self) -> None: ...

    monkeypatch.setattr(diagnosis, "_snapshot_dir", tmp_path)
    monkeypatch.setattr(diagnosis, "_history_entries", 0)
    assert diagnosis.capture_snapshot(Cuda(), "vit-article/a") is None
    monkeypatch.setattr(diagnosis, "_history_entries", 10)
    CudaProbe(Cuda(), history_entries=10).capture_snapshot("vit-article/a")
    assert diagnosis.recipe_snapshot("vit-article/a") == tmp_path / "vit-article-a.snapshot.pickle"
    assert diagnosis.recipe_snapshot("vit-article/b") is None
