"""memclaims.core.record: the Record's migration from the flat technique fields of schema 1 (issue #51)."""

from __future__ import annotations

import copy
import dataclasses

from memclaims.core.record import RETIRED_FIELDS, Record, migrate
from memclaims.pytest.testing import fake_record
from memclaims.techniques.technique_registry import TECHNIQUES


def test_each_retired_field_moves_into_its_techniques_part_and_nulls_are_dropped() -> None:
    old = {**fake_record().to_dict(), **dict.fromkeys(RETIRED_FIELDS)}  # schema 1: every Record had every field
    old.update(fused_loss_calls=3, fused_loss_rows=None, trainable_parameters=8386, total_parameters=150000,
               quantized_parameter_bytes=32768, by_technique={"qlora": {"packed_bytes": 32768}})
    before = copy.deepcopy(old)
    new = migrate(old)
    assert old == before  # the stored dict is left as it was
    assert not RETIRED_FIELDS.keys() & new.keys()
    assert new["by_technique"] == {"fused-linear-ce": {"fused_loss_calls": 3},
                                   "lora": {"trainable_parameters": 8386, "total_parameters": 150000},
                                   "qlora": {"packed_bytes": 32768, "quantized_parameter_bytes": 32768}}
    record = Record.from_dict(old)
    assert record.observed("lora", "trainable_parameters") == 8386 and record.observed("lora", "missing") is None
    assert record.observed("paged-adamw8bit", "paged_state_bytes") is None
    assert migrate(record.to_dict()) == record.to_dict()  # today's form comes back as it is
    assert Record.from_dict(record.to_dict()) == record


def test_a_record_without_observations_reads_as_before() -> None:
    old = {**fake_record().to_dict(), **dict.fromkeys(RETIRED_FIELDS)}
    assert "by_technique" not in migrate(old) and Record.from_dict(old) == fake_record()


def test_the_retired_fields_name_registered_techniques_and_no_field_of_the_record() -> None:
    names = {technique.name for technique in TECHNIQUES}
    assert set(RETIRED_FIELDS.values()) <= names
    assert not RETIRED_FIELDS.keys() & {f.name for f in dataclasses.fields(Record)}


def test_a_part_keeps_an_observed_none_but_not_a_retired_fields_and_equals_the_migrated_old_form() -> None:
    """One rule for None in every technique's part (``techniques.base.observations``, ``Record.__post_init__``):
    kept where it is an observation (optimizer-impl's one measured step: no temporaries alone), left out under a
    retired flat field's key, as ``migrate`` leaves the old form's null out; a part left empty is no part."""
    from memclaims.techniques.base import merge_observed, observations

    fields: dict[str, object] = {}
    merge_observed(fields, observations("fused", measured_step=1, step_temporary_bytes=None))
    merge_observed(fields, observations("paged-adamw8bit", paged_state_bytes=None))
    merge_observed(fields, observations("lora", trainable_parameters=8386, total_parameters=None))
    assert observations("lora") == {}
    today = fake_record(**fields)
    assert today.by_technique == {"fused": {"measured_step": 1, "step_temporary_bytes": None},
                                  "lora": {"trainable_parameters": 8386}}
    assert today.observed("fused", "step_temporary_bytes", 0) is None  # an observed None, not the default
    assert today.observed("paged-adamw8bit", "paged_state_bytes", 0) == 0
    old = {**fake_record().to_dict(), **dict.fromkeys(RETIRED_FIELDS), "trainable_parameters": 8386,
           "by_technique": {"fused": {"measured_step": 1, "step_temporary_bytes": None}}}  # schema 1's form of it
    assert Record.from_dict(old) == today and migrate(old) == today.to_dict()
