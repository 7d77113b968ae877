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
