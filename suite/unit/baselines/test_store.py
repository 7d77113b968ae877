"""The baseline store on constructed Records, without a pytest session: where a Record's baseline
is looked for (its class, then the closest sibling of its family), what a write keeps and stores,
that a failed write leaves the file as it was, obtained -> accepted, and the tolerance files.

Also (the second part of this file): fuzzing the baseline file parser: any bytes on disk give a store or one clear BaselineError.

suite/unit/measure/test_runner.py fuzzes recipe parsing; this part fuzzes what a user, a merge conflict or a crashed
writer can leave in ``baselines/measured/<env>.json``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memclaims.baselines import store as b
from memclaims.baselines.store import SCHEMA, Baseline, BaselineError, BaselineStore
from memclaims.core.record import Record
from memclaims.pytest.testing import fake_record

AVX2 = {"machine": "x86_64", "capability": "avx2", "half_features": [], "torch_build": "cu130"}
AVX512 = {"machine": "x86_64", "capability": "avx512", "half_features": [], "torch_build": "cu130"}
AVX512_BF16 = {**AVX512, "half_features": ["bf16"]}
ARM = {"machine": "aarch64", "capability": "sve256", "half_features": [], "torch_build": "cu130"}
H200 = {"gpu": "NVIDIA H200", "cuda": "13.0", "cudnn": 91200}


def test_environment_ids_of_the_sim_and_of_old_records() -> None:
    assert b.environment_id(fake_record(device="sim", probe="sim:h100")) == "sim-h100"
    assert b.environment_id(fake_record(device="sim", probe="sim:h100"), profile="a100") == "sim-a100"
    assert b.environment_id(fake_record(device="sim", probe="sim")) == "sim-default"
    assert b.environment_id(fake_record(environment=AVX512_BF16)) == "cpu-x86_64-avx512-bf16-cu130"
    assert b.environment_id(fake_record(device="cuda", environment=AVX2, device_name="Old GPU")) == "old-gpu"
    assert b.environment_id(fake_record(device="cpu", environment=H200, device_name="cpu-x86_64")) == "cpu-x86_64"


def test_find_prefers_its_own_class_then_the_closest_sibling_of_its_family(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for environment, accuracy in ((AVX2, 0.1), (AVX512_BF16, 0.2), (ARM, 0.3)):
        store.store_record(fake_record(environment=environment, accuracy=accuracy))
    store.store_record(fake_record(device="cuda", environment=H200, accuracy=0.4))
    assert store.environments() == ["cpu-aarch64-sve256-cu130", "cpu-x86_64-avx2-cu130",
                                    "cpu-x86_64-avx512-bf16-cu130", "nvidia-h200-cuda13.0-cudnn91200"]
    own = store.find(fake_record(environment=AVX2))
    assert own is not None and own[1] == "cpu-x86_64-avx2-cu130" and own[0].record.accuracy == 0.1
    # avx512 without bf16 shares more of its id with avx512-bf16 than with avx2; never the arm class.
    sibling = store.find(fake_record(environment=AVX512))
    assert sibling is not None and sibling[1] == "cpu-x86_64-avx512-bf16-cu130"
    assert store.find(fake_record(environment={**ARM, "capability": "sve128"}))[1] == "cpu-aarch64-sve256-cu130"
    other_cuda = store.find(fake_record(device="cuda", environment={**H200, "cuda": "12.8"}))
    assert other_cuda is not None and other_cuda[1] == "nvidia-h200-cuda13.0-cudnn91200"
    assert store.find(fake_record(device="cuda", environment={**H200, "gpu": "NVIDIA A100"})) is None
    assert store.find(fake_record(environment=AVX2, recipe="vit-smoke/other")) is None
    assert store.find(fake_record(environment={**AVX2, "machine": "riscv64"})) is None


def test_find_breaks_ties_by_name(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for capability in ("zz", "aa"):
        store.store_record(fake_record(environment={**AVX2, "capability": capability}))
    found = store.find(fake_record(environment={**AVX2, "capability": "mm"}))
    assert found is not None and found[1] == "cpu-x86_64-aa-cu130"


def test_environments_leave_out_obtained_files(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    assert store.environments() == []
    store.store_record(fake_record(environment=AVX2), obtained=True)
    assert store.environments() == []
    store.store_record(fake_record(environment=AVX2))
    assert store.environments() == ["cpu-x86_64-avx2-cu130"]


def test_update_keeps_other_recipes_and_replaces_its_own(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.update("env", {"a": Baseline(fake_record("a")), "b": Baseline(fake_record("b", accuracy=0.1))})
    BaselineStore(tmp_path).update("env", {"b": Baseline(fake_record("b", accuracy=0.2), {"accuracy": 0.05})})
    stored = BaselineStore(tmp_path).load("env")
    assert sorted(stored) == ["a", "b"] and stored["b"].record.accuracy == 0.2
    assert stored["b"].tolerances == {"accuracy": 0.05}
    assert store.load("env")["b"].record.accuracy == 0.1  # cached until asked fresh
    assert store.load("env", fresh=True)["b"].record.accuracy == 0.2
    text = store.path("env").read_text()
    assert text == b.dumps("env", stored) and text.endswith("}\n")
    assert list(store.measured.glob(".*.tmp")) == []


def test_a_failed_write_leaves_the_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = BaselineStore(tmp_path)
    store.update("env", {"a": Baseline(fake_record("a"))})
    before = store.path("env").read_bytes()

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(BaselineError, match="cannot be written \\(disk full"):  # one line, not a traceback
        store.update("env", {"b": Baseline(fake_record("b"))})
    assert store.path("env").read_bytes() == before
    assert BaselineStore.temp_files(store.path("env")) == []
    assert sorted(store.load("env")) == ["a"]  # the cache did not take the failed write


def test_a_killed_writers_temp_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.measured.mkdir(parents=True)
    leftover = store.measured / ".env.json.0123456789ab.tmp"
    unrelated = store.measured / ".other.json.0123456789ab.tmp"
    leftover.write_text("{")
    unrelated.write_text("{")
    assert BaselineStore.temp_files(store.path("env")) == [leftover]
    store.update("env", {"a": Baseline(fake_record("a"))})
    assert not leftover.exists() and unrelated.exists()
    assert (store.measured / "env.json.lock").exists()  # the lock file stays


def test_store_record_keeps_stored_tolerances_and_stores_only_overrides(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    record = fake_record(environment=AVX2)
    environment = b.environment_id(record)
    store.store_record(record, {"accuracy": 0.05, "peak_allocated_bytes": 0.005, "param_bytes": None})
    assert store.load(environment, fresh=True)["vit-smoke/fake-a"].tolerances == {"accuracy": 0.05,
                                                                                    "param_bytes": None}
    path = store.store_record(fake_record(environment=AVX2, accuracy=0.7))
    assert path == store.path(environment)
    stored = store.load(environment, fresh=True)["vit-smoke/fake-a"]
    assert stored.record.accuracy == 0.7 and stored.tolerances == {"accuracy": 0.05, "param_bytes": None}
    store.store_record(fake_record(environment=AVX2), {})
    assert store.load(environment, fresh=True)["vit-smoke/fake-a"].tolerances == {}
    assert b.overrides(fake_record(device="cuda"), {"peak_allocated_bytes": 0.03, "accuracy": 0.02,
                                                    "custom": 0.1}) == {"custom": 0.1}
    assert b.overrides(fake_record(device="cuda"), {"peak_allocated_bytes": 0.005}) == {"peak_allocated_bytes": 0.005}


def test_obtained_then_accepted(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    environment = "cpu-x86_64-avx2-cu130"
    with pytest.raises(BaselineError, match="nothing to accept"):
        store.accept(environment)
    obtained = store.store_record(fake_record(environment=AVX2), obtained=True)
    assert obtained == store.path(environment + b.OBTAINED) and obtained.exists()
    store.store_record(fake_record("vit-smoke/fake-b", environment=AVX2), obtained=True)
    assert store.get(environment, "vit-smoke/fake-a") is None
    path, keys = store.accept(environment)
    assert path == store.path(environment) and keys == ["vit-smoke/fake-a", "vit-smoke/fake-b"]
    assert not obtained.exists()
    assert sorted(BaselineStore(tmp_path).load(environment)) == keys
    assert store.load(environment + b.OBTAINED) == {}
    with pytest.raises(BaselineError, match="nothing to accept"):
        store.accept(environment)


def test_measured_noise_and_a_tolerance_file_that_cannot_be_trusted(tmp_path: Path) -> None:
    file = tmp_path / "tolerances.json"
    store = BaselineStore(tmp_path, tolerances=file)
    assert store.tolerances() == {} and store.noise().accuracy == {}
    file.write_text(json.dumps({"schema": b.TOLERANCE_SCHEMA, "accuracy": {"recipes": {
        "vit-converged/sgd": {"same": 0.005, "change": 0.02, "by_seed": {"123": 0.95, "1": 0.96}}}},
        "losses": {"per_step": [0.001, 0.002]}}))
    noise = BaselineStore(tmp_path, tolerances=file).noise()
    assert (noise.accuracy["vit-converged/sgd"].change, noise.loss_per_step) == (0.02, [0.001, 0.002])
    for text, problem in (("{", "cannot be read"), (json.dumps({"schema": 99}), "expected an object with schema 1"),
                          ("[1]", "expected an object"),
                          (json.dumps({"schema": 1, "accuracy": {"recipes": {"r": {"same": 0.1}}}}),
                           "not the measured noise memclaims writes")):
        file.write_text(text)
        with pytest.raises(BaselineError, match=problem):
            BaselineStore(tmp_path, tolerances=file).noise()


def test_the_store_reads_a_users_own_noise_else_the_packaged_one(tmp_path: Path) -> None:
    from memclaims.core import packaged

    assert BaselineStore(tmp_path).tolerance_file() == packaged.resource(packaged.TOLERANCES)
    own = tmp_path / "tolerances.json"  # memclaims baselines spread --out BASELINES_DIR/tolerances.json
    own.write_text(json.dumps({"schema": 1, "accuracy": {"recipes": {}}}))
    assert BaselineStore(tmp_path).tolerance_file() == own
    assert BaselineStore(tmp_path).tolerances() == {"schema": 1, "accuracy": {"recipes": {}}}
    given = tmp_path / "given.json"
    assert BaselineStore(tmp_path, tolerances=given).tolerance_file() == given


def test_published_numbers_file(tmp_path: Path) -> None:
    from memclaims.core.errors import DataError
    from memclaims.core.published import load_published

    path = tmp_path / "published.json"
    with pytest.raises(DataError, match="cannot be read"):
        load_published(path)
    for text in ("{", json.dumps({"schema": 2}), json.dumps([1]), json.dumps({})):
        path.write_text(text)
        with pytest.raises(DataError, match=f"published numbers {path}"):
            load_published(path)
    path.write_text(json.dumps({"schema": 1, "rows": [1]}))
    assert load_published(path) == {"schema": 1, "rows": [1]}


def test_claims_source_files(tmp_path: Path) -> None:
    """One file per quoted source: schema, required keys and file name checked, a claim id in two
    files named with both, every packaged claim tagged with its file's document."""
    from memclaims.core import published
    from memclaims.core.errors import DataError

    path = tmp_path / "lora-paper.json"
    with pytest.raises(DataError, match="cannot be read"):
        published.load_source(path)
    for text in ("{", json.dumps({"schema": 1, "document": "lora-paper"}), json.dumps([1])):
        path.write_text(text)
        with pytest.raises(DataError, match=f"claims source {path}: "):
            published.load_source(path)
    source = {"schema": 1, "document": "lora-paper", "title": "LoRA", "where": "arXiv:2106.09685",
              "claims": [{"id": "lora-x"}]}
    path.write_text(json.dumps({**source, "document": "peft-docs"}))
    with pytest.raises(DataError, match="name the file peft-docs.json"):
        published.load_source(path)
    path.write_text(json.dumps(source))
    loaded = published.load_source(path)
    assert published.merge_sources([loaded])["claims"] == [{"id": "lora-x", "document": "lora-paper"}]
    with pytest.raises(DataError, match="'lora-x' is in both lora-paper.json and peft-docs.json"):
        published.merge_sources([loaded, ("peft-docs.json", {**source, "document": "peft-docs"})])
    packaged = published.data()
    assert {c["document"] for c in packaged["claims"]} == set(published.documents())
    assert {"article", "course", "pytorch-docs", "pytorch-tutorial"} <= set(published.documents())


def test_non_finite_numbers_are_stored_as_null() -> None:
    raw = Baseline(fake_record(final_loss=math.nan, accuracy=math.inf, memory_losses=[1.0, -math.inf],
                               phases={"load": {"allocated_bytes": 1, "x": math.nan}})).to_json()
    assert raw["record"]["final_loss"] is None and raw["record"]["accuracy"] is None
    assert raw["record"]["memory_losses"] == [1.0, None]
    assert raw["record"]["phases"] == {"load": {"allocated_bytes": 1, "x": None}}
    assert json.loads(json.dumps(raw, allow_nan=False)) == raw


@pytest.mark.parametrize(("value", "kind", "ok"), [
    (1, "int", True), (True, "int", False), (1.0, "int", False), (None, "int", False),
    (None, "int|None", True), (False, "int|None", False), (3, "int|None", True),
    (0.5, "number|None", True), (2, "number|None", True), (None, "number|None", True),
    (math.nan, "number|None", False), (True, "number|None", False), ("1", "number|None", False),
    ("x", "str", True), (1, "str", False),
])
def test_field_types(value: object, kind: str, ok: bool) -> None:
    assert b._type_ok(value, kind) is ok


def _file(**changes: object) -> str:
    data = json.loads(b.dumps("env", {"vit-smoke/fake-a": Baseline(fake_record())}))
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(("text", "problem"), [
    (json.dumps({"schema": 0, "environment": "env", "records": {}}), "unknown schema 0"),
    ("[1, 2]", "top level must be an object, found list [1, 2]"),
    (json.dumps({"schema": True, "environment": "env", "records": {}}), "'schema' must be an integer, found bool true"),
    (json.dumps({"schema": 3, "environment": "env", "records": {}}), "schema 3 is newer than this memclaims reads"),
    (json.dumps({"schema": 1, "environment": 3, "records": {}}), "'environment' must be a string, found int 3"),
    (json.dumps({"schema": 1, "environment": "other", "records": {}}), "'environment' is 'other' but the file name"),
    (json.dumps({"schema": 1, "environment": "env", "records": []}), "'records' must be an object, found list []"),
    (json.dumps({"schema": 1, "environment": "env", "records": {"r": 1}}), "records['r'] must be an object, found int 1"),
    (json.dumps({"schema": 1, "environment": "env", "records": {"r": {"record": "x"}}}),
     "records['r'].record must be an object, found str \"x\""),
    ("[" * 100_000, "nested too deeply"),
])
def test_parse_names_each_problem(text: str, problem: str) -> None:
    with pytest.raises(BaselineError) as error:
        b.parse(text, Path("env.json"), "env")
    assert problem in str(error.value) and "baseline file env.json" in str(error.value)
    assert "the file was left unchanged" in str(error.value)


def test_parse_checks_each_record() -> None:
    good = json.loads(_file())
    assert list(b.parse(json.dumps(good), Path("f"), "env")) == ["vit-smoke/fake-a"]
    assert list(b.parse(json.dumps(good), Path("f"))) == ["vit-smoke/fake-a"]  # no file name to check against
    entry = good["records"]["vit-smoke/fake-a"]
    cases = [({"record": {**entry["record"], "recipe": "vit-smoke/other"}}, "belongs under 'vit-smoke/other'"),
             ({"record": {k: v for k, v in entry["record"].items() if k != "param_bytes"}}, "lacks 'param_bytes'"),
             ({"record": {**entry["record"], "peak_allocated_bytes": 1.5}}, "peak_allocated_bytes must be int"),
             ({"record": {**entry["record"], "versions": {"torch": 2}}}, "versions must map package names"),
             ({"record": entry["record"], "tolerances": {"accuracy": "x"}}, "tolerances must map metric names"),
             ({"record": entry["record"], "tolerances": [0.1]}, "tolerances must map metric names"),
             ({"record": {k: v for k, v in entry["record"].items() if k != "workload"}}, "is not a Record")]
    for broken, problem in cases:
        with pytest.raises(BaselineError, match=problem.replace("(", r"\(").replace("[", r"\[")):
            b.parse(json.dumps({**good, "records": {"vit-smoke/fake-a": broken}}), Path("f"), "env")
    parsed = b.parse(json.dumps({**good, "records": {"vit-smoke/fake-a": {"record": entry["record"]}}}), Path("f"))
    assert parsed["vit-smoke/fake-a"].tolerances == {}
    with_tolerance = {"record": entry["record"], "tolerances": {"accuracy": None, "peak_allocated_bytes": 0.01}}
    parsed = b.parse(json.dumps({**good, "records": {"vit-smoke/fake-a": with_tolerance}}), Path("f"))
    assert parsed["vit-smoke/fake-a"].tolerances == {"accuracy": None, "peak_allocated_bytes": 0.01}


def test_a_file_that_is_not_utf8_is_an_error_and_left_alone(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.measured.mkdir(parents=True)
    store.path("env").write_bytes(b"\xff\xfe{")
    with pytest.raises(BaselineError, match="not UTF-8 text"):
        store.load("env")
    with pytest.raises(BaselineError):
        store.update("env", {"a": Baseline(fake_record("a"))})
    assert store.path("env").read_bytes() == b"\xff\xfe{"


def test_layout_mode_and_what_a_write_rereads_under_the_lock(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    assert store.path("env") == tmp_path / "measured" / "env.json"
    first, second = BaselineStore(tmp_path), BaselineStore(tmp_path)
    assert first.load("env") == {}  # cached empty
    second.update("env", {"b": Baseline(fake_record("b"))})
    first.update("env", {"a": Baseline(fake_record("a"))})  # re-reads the file: b survives
    assert sorted(BaselineStore(tmp_path).load("env")) == ["a", "b"]
    umask = os.umask(0)
    os.umask(umask)
    assert store.path("env").stat().st_mode & 0o777 == 0o644 & ~umask


def test_a_file_under_another_environments_name_is_refused(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.update("other", {"a": Baseline(fake_record("a"))})
    store.path("other").rename(store.path("env"))
    with pytest.raises(BaselineError, match="'environment' is 'other' but the file name says 'env'"):
        store.load("env")


def test_nan_tolerance_is_refused_before_the_file_changes(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.update("env", {"a": Baseline(fake_record("a"))})
    before = store.path("env").read_bytes()
    with pytest.raises(ValueError):
        store.update("env", {"a": Baseline(fake_record("a"), {"accuracy": math.nan})})
    assert store.path("env").read_bytes() == before and BaselineStore.temp_files(store.path("env")) == []


def test_profiles_and_other_writers_are_seen(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    sim = fake_record(device="sim", probe="sim:article")
    assert store.store_record(sim, profile="a100") == store.path("sim-a100")
    found = store.find(sim, profile="a100")
    assert found is not None and found[1] == "sim-a100" and store.find(sim) is None
    # Tolerances stored by another process since this store read the file are kept.
    record = fake_record(environment=AVX2)
    environment = b.environment_id(record)
    mine = BaselineStore(tmp_path)
    assert mine.load(environment) == {}
    BaselineStore(tmp_path).store_record(record, {"accuracy": 0.05})
    mine.store_record(record)
    assert BaselineStore(tmp_path).load(environment)[record.recipe].tolerances == {"accuracy": 0.05}
    # Obtained by another process after this store looked: accepted all the same.
    other = BaselineStore(tmp_path)
    assert other.load(environment + b.OBTAINED) == {}
    BaselineStore(tmp_path).store_record(fake_record("vit-smoke/new", environment=AVX2), obtained=True)
    assert other.accept(environment)[1] == ["vit-smoke/new"]


def test_a_cpu_class_recorded_without_half_features() -> None:
    old_class = {k: v for k, v in AVX2.items() if k != "half_features"}
    assert b.environment_id(fake_record(environment=old_class)) == "cpu-x86_64-avx2-cu130"


# --- fuzzing the baseline file parser ----------------------------------------------------------------


ENV = "cpu-x86_64"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)

_RECORD = {"recipe": "vit-smoke/a", "device": "cpu", "device_name": ENV, "param_bytes": 1, "grad_bytes": 1,
           "optimizer_state_bytes": 1, "load_peak_bytes": 1, "peak_allocated_bytes": 1,
           "peak_reserved_bytes": None, "accuracy": 0.5, "step_time_s": 0.1}


@st.composite
def near_valid_files(draw: Any) -> Any:
    """A valid file with one value somewhere replaced: reaches the deep checks, not just the top."""
    record = dict(_RECORD)
    data: dict[str, Any] = {"schema": SCHEMA, "environment": ENV,
                            "records": {"vit-smoke/a": {"record": record, "tolerances": {}}}}
    where = draw(st.sampled_from(["top", "entry", "record", "tolerances", "versions", "extra"]))
    key = draw(st.sampled_from(sorted(_RECORD) + ["schema", "environment", "records", "weird"]))
    value = draw(json_values)
    target = {"top": data, "entry": data["records"]["vit-smoke/a"], "record": record,
              "tolerances": data["records"]["vit-smoke/a"]["tolerances"], "extra": record}[where] \
        if where != "versions" else record.setdefault("versions", {})
    if where == "extra":
        key = draw(st.sampled_from(["batch_size", "techniques", "breakdown", "nan_loss", "memory_steps"]))
    target[key] = value
    return data


def _load_once(content: bytes) -> None:
    """Write ``content`` as the baseline file, load it; a store or one-line BaselineError only."""
    with tempfile.TemporaryDirectory() as root:
        store = BaselineStore(root)
        path = store.path(ENV)
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
        try:
            loaded = store.load(ENV)
        except BaselineError as error:
            message = str(error)
            assert "\n" not in message and str(path) in message, message
        else:
            assert all(isinstance(v, Baseline) for v in loaded.values())
        assert path.read_bytes() == content, "loading changed the file"


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(content: bytes) -> None:
    _load_once(content)


@FUZZ
@given(json_values)
def test_arbitrary_json_values(value: Any) -> None:
    _load_once(json.dumps(value).encode())


@FUZZ
@given(near_valid_files())
def test_valid_file_with_one_value_replaced(data: Any) -> None:
    _load_once(json.dumps(data).encode())


def test_deeply_nested_json_is_a_baseline_error(tmp_path: Path) -> None:
    # json.loads raises RecursionError, not JSONDecodeError, on deep nesting.
    _load_once(b"[" * 100_000 + b"]" * 100_000)


def test_an_update_rewrites_only_the_records_it_measured(tmp_path: Path) -> None:
    """A record stored by an older memclaims (fewer Record fields) stays byte for byte as stored when another
    recipe of its file is updated: today's Record would add each newer field as null."""
    store = BaselineStore(tmp_path)
    store.update("cpu-x86_64", {"vit-smoke/a": Baseline(fake_record(recipe="vit-smoke/a"), {})})
    path = store.path("cpu-x86_64")
    data = json.loads(path.read_text())
    old = data["records"]["vit-smoke/a"]
    del old["record"]["notes"]  # a field this record's memclaims did not have yet
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    store.update("cpu-x86_64", {"vit-smoke/b": Baseline(fake_record(recipe="vit-smoke/b"), {})})
    after = json.loads(path.read_text())["records"]
    assert after["vit-smoke/a"] == old and "notes" not in after["vit-smoke/a"]["record"]
    assert after["vit-smoke/b"]["record"]["recipe"] == "vit-smoke/b"
    assert store.get("cpu-x86_64", "vit-smoke/a").record.recipe == "vit-smoke/a"  # still read as today's Record


@pytest.mark.parametrize("environment", ["cpu-x86_64-avx512-bf16-cu130", "sim-article"])
def test_a_schema_1_file_reads_through_the_migration_and_its_first_update_writes_schema_2(
        tmp_path: Path, environment: str) -> None:
    """A baseline file of the old form (schema 1, the flat technique fields): every observation reads from its
    technique's part, as the judged numbers read as stored; an update writes the file whole as schema 2, each record
    moved and nothing else changed. The samples (schema1/) are the committed files as they were at schema 1, cut to
    their records with observations of the old form and two without: the committed files themselves move to schema 2
    at their first refresh."""
    import shutil

    from memclaims.baselines.compare import measured_metrics
    from memclaims.core.record import RETIRED_FIELDS, migrate

    store = BaselineStore(tmp_path)
    store.measured.mkdir()
    shutil.copy(Path(__file__).parent / "schema1" / f"{environment}.json", store.path(environment))
    old = json.loads(store.path(environment).read_text())
    assert old["schema"] == 1
    moved = [(key, field, value) for key, entry in old["records"].items()
             for field, value in entry["record"].items() if field in RETIRED_FIELDS and value is not None]
    assert moved  # the file holds observations of the old form
    loaded = store.load(environment)
    for key, field, value in moved:
        assert loaded[key].record.observed(RETIRED_FIELDS[field], field) == value
    for key, entry in old["records"].items():  # every compared number as the file stores it
        raw = entry["record"]
        assert measured_metrics(loaded[key].record) == measured_metrics(Record.from_dict(
            {k: v for k, v in raw.items() if k not in RETIRED_FIELDS}))
    first = sorted(old["records"])[0]
    store.update(environment, {first: loaded[first]})
    new = json.loads(store.path(environment).read_text())
    assert new["schema"] == SCHEMA == 2
    for key, entry in old["records"].items():
        assert not RETIRED_FIELDS.keys() & new["records"][key]["record"].keys()
        if key != first:
            assert new["records"][key] == {**entry, "record": migrate(entry["record"])}
    assert store.load(environment, fresh=True) == loaded
