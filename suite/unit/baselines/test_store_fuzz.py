"""Fuzzing the baseline file parser: any bytes on disk give a store or one clear BaselineError.

test_reliability fuzzes recipe parsing; this fuzzes what a user, a merge conflict or a crashed
writer can leave in ``baselines/measured/<env>.json``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memclaims.baselines.store import SCHEMA, Baseline, BaselineError, BaselineStore

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
