"""Pure source semantics: startup modes, limits, waiting for a minimum, Spark splits, lost ranges, spec checks."""

from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from microbatch.config import PIPELINES_DIR, OnDataLoss, SourceSpec, Startup, load_spec
from microbatch.errors import DataLossError, SpecError
from microbatch.kafka.offsets import needs_group_offsets, needs_offsets_for_time
from microbatch.planning import (
    data_loss_at_read,
    defer_reason,
    lost_ranges,
    plan_batch,
    plan_ranges,
    spark_splits,
)
from microbatch.types import OffsetRange, StartupOffsets, TopicPartition

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))
LOW = {T0: 0, T1: 0, T2: 0}
HIGH = {T0: 100, T1: 100, T2: 100}


def source(**kwargs) -> SourceSpec:
    return SourceSpec.model_validate({"topics": ["t"], **kwargs})


def test_group_offsets_with_reset_for_partitions_without_one():
    spec = source(startup={"mode": "group_offsets", "reset": "latest"})
    assert needs_group_offsets(spec, [T0]) and not needs_offsets_for_time(spec, [T0])
    plan = plan_batch({}, LOW, HIGH, spec, StartupOffsets(committed={T0: 40, T1: None}))
    assert plan.starts == {T0: 40, T1: 100, T2: 100}
    assert plan.ranges == (OffsetRange("t", 0, 40, 100),)
    assert plan.startup[T1] == "latest (no committed group offset)"


def test_group_offsets_are_ignored_for_partitions_the_ledger_knows():
    spec = source(startup="group_offsets")
    plan = plan_batch({T0: 90}, {T0: 0}, {T0: 100}, spec, StartupOffsets(committed={T0: 10}))
    assert plan.ranges == (OffsetRange("t", 0, 90, 100),)
    assert not needs_group_offsets(spec, [])


def test_timestamp_uses_offsets_for_times_and_latest_when_none():
    spec = source(startup={"mode": "timestamp", "timestamp": "2026-01-01T00:00:00Z"})
    assert spec.startup.timestamp == 1767225600000
    plan = plan_batch({}, LOW, HIGH, spec, StartupOffsets(for_time={T0: 7, T1: None, T2: 100}))
    assert plan.starts == {T0: 7, T1: 100, T2: 100}
    assert source(startup={"mode": "timestamp", "timestamp": 1767225600000}).startup.timestamp == 1767225600000


def test_specific_offsets_fall_back_to_group_then_reset():
    spec = source(startup={"mode": "specific_offsets", "offsets": {"t:0": 5}})
    assert not needs_group_offsets(spec, [T0]) and needs_group_offsets(spec, [T0, T1])
    plan = plan_batch({}, LOW, HIGH, spec, StartupOffsets(committed={T1: 30}))
    assert plan.starts == {T0: 5, T1: 30, T2: 0}


def test_startup_offset_outside_the_partition_is_refused():
    spec = source(startup={"mode": "specific_offsets", "offsets": {"t:0": 500}})
    with pytest.raises(SpecError, match=r"t\[0\]: the startup specific offset 500 lies outside .*\[0, 100\]"):
        plan_batch({}, LOW, HIGH, spec)
    with pytest.raises(SpecError, match="group offset 3 lies outside"):
        plan_batch({}, {T0: 10}, {T0: 20}, source(startup="group_offsets"), StartupOffsets(committed={T0: 3}))


def test_specific_offset_for_an_unknown_partition_is_a_spec_error():
    spec = source(startup={"mode": "specific_offsets", "offsets": {"t:9": 1}})
    with pytest.raises(SpecError, match=r"names partition t:9, but topic 't' has partitions 0..2"):
        plan_batch({}, LOW, HIGH, spec)


def test_max_records_per_partition_caps_each_partition_before_the_split():
    ranges, _ = plan_ranges({T0: 0, T1: 0, T2: 90}, HIGH, 1000, 30)
    assert [r.size for r in ranges] == [30, 30, 10]
    ranges, _ = plan_ranges({T0: 0, T1: 0, T2: 90}, HIGH, 40, 30)
    assert sum(r.size for r in ranges) == 40


def test_catch_up_takes_the_expected_number_of_batches():
    spec = source(max_records_per_batch=70, max_records_per_partition=30)
    positions: dict[TopicPartition, int] = {}
    batches = 0
    while True:
        plan = plan_batch(positions, LOW, HIGH, spec)
        if not plan.ranges:
            break
        batches += 1
        assert plan.records <= 70 and all(r.size <= 30 for r in plan.ranges)
        positions.update({r.tp: r.end for r in plan.ranges})
    assert batches == 5  # 300 offsets at most 70 per batch (and 30 per partition): ceil(300 / 70) = 5
    assert positions == HIGH


def test_min_records_defers_until_enough_or_the_wait_limit():
    spec = source(min_records_per_batch=50, max_wait_seconds=60)
    assert defer_reason(10, spec, 5) is not None
    assert defer_reason(10, spec, 61) is None
    assert defer_reason(50, spec, 0) is None
    assert defer_reason(0, spec, 0) is None
    plan = plan_batch({T0: 95}, {T0: 0}, {T0: 100}, spec, waited_seconds=1)
    assert plan.ranges == () and "below min_records_per_batch 50" in plan.deferred
    assert plan.backlog == {T0: 5}
    assert plan_batch({T0: 95}, {T0: 0}, {T0: 100}, spec, waited_seconds=120).records == 5
    assert source(min_records_per_batch=5).wait_limit_seconds == 900


def test_spark_splits_are_deterministic_and_cover_each_range_exactly():
    one = [OffsetRange("t", 0, 10, 1010)]
    assert spark_splits(one, 0) == one
    pieces = spark_splits(one, 4)
    assert pieces == [OffsetRange("t", 0, 10, 260), OffsetRange("t", 0, 260, 510), OffsetRange("t", 0, 510, 760),
                      OffsetRange("t", 0, 760, 1010)]
    assert spark_splits(one, 4) == pieces
    mixed = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 0, 7)]
    split = spark_splits(mixed, 5)
    assert len(split) >= 5 and sum(r.size for r in split) == 1017
    for r in mixed:  # consecutive, no overlap, no hole
        mine = [p for p in split if p.tp == r.tp]
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in pairwise(mine))
    assert spark_splits(mixed, 2) == mixed


def test_disappeared_topics_are_reported_and_kept():
    gone = TopicPartition("old", 0)
    plan = plan_batch({gone: 4, T0: 100}, {T0: 0}, {T0: 100}, source())
    assert plan.disappeared_topics == ("old",)


def test_lag_before_and_after_the_batch():
    plan = plan_batch({T0: 0, T1: 90}, {T0: 0, T1: 0}, {T0: 100, T1: 100}, source(max_records_per_batch=50))
    assert plan.backlog == {T0: 100, T1: 10}
    after = plan.lag_after_by_partition()
    assert sum(after.values()) == plan.lag_after == 60


def test_ranges_deleted_between_plan_and_stage_are_named():
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 50, 60)]
    lost = lost_ranges(ranges, {T0: 30, T1: 40})
    assert lost == [OffsetRange("t", 0, 0, 30)]
    error = data_loss_at_read(7, lost, OnDataLoss.FAIL)
    assert isinstance(error, DataLossError)
    assert str(error).startswith("Batch 7: offsets t[0] [0, 30) were deleted by retention")
    assert "on_data_loss: skip" in str(error) and "\n" not in str(error)


def test_legacy_bool_and_group_id_still_load():
    spec = source(commit_group_offsets=True, group_id="lag-tools")
    assert spec.commit_group_offsets.enabled and spec.group_id == "lag-tools"
    assert not source(commit_group_offsets=False).commit_group_offsets
    assert source().startup.mode is Startup.EARLIEST


def test_topic_pattern_instead_of_topics():
    spec = SourceSpec.model_validate({"topic_pattern": r"events\..*"})
    assert spec.topics == [] and spec.matches("events.a") and not spec.matches("xevents.a")


def _base() -> dict:
    return yaml.safe_load((PIPELINES_DIR / "ip_count.yaml").read_text()) | {"name": "demo"}


@pytest.mark.parametrize(
    ("source_update", "message"),
    [
        ({"startup": "sometimes"}, "field 'source.startup' 'sometimes' is not a startup mode"),
        ({"startup": {"mode": "at_noon"}}, "field 'source.startup.mode'"),
        ({"startup": "timestamp"}, "field 'source.startup' mode 'timestamp' needs 'timestamp'"),
        ({"startup": {"mode": "timestamp", "timestamp": "yesterday"}}, "'yesterday' is neither an ISO-8601"),
        ({"startup": "specific_offsets"}, "mode 'specific_offsets' needs 'offsets'"),
        ({"startup": {"mode": "specific_offsets", "offsets": {"t0": 1}}}, "must look like 'topic:partition'"),
        ({"startup": {"mode": "specific_offsets", "offsets": {"t:0": -1}}}, "must not be negative"),
        ({"startup": {"mode": "earliest", "timestamp": 5}}, "'timestamp' is only used by mode 'timestamp'"),
        ({"topics": None, "topic_pattern": "events[("}, "field 'source.topic_pattern' 'events[(' is not a valid"),
        ({"topic_pattern": "events.*"}, "field 'source.topics' cannot be set together with topic_pattern"),
        ({"max_records_per_partition": -5}, "field 'source.max_records_per_partition'"),
        ({"min_records_per_batch": 0}, "field 'source.min_records_per_batch'"),
        ({"max_wait_seconds": 10}, "max_wait_seconds only applies with min_records_per_batch"),
        ({"min_records_per_batch": 10, "max_records_per_batch": 5}, "is above max_records_per_batch"),
        ({"commit_group_offsets": {"enabled": True, "group": "x"}},
         "field 'source.commit_group_offsets.group' is not a known setting"),
    ],
)
def test_bad_source_values_name_file_and_field(tmp_path: Path, source_update, message):
    data = _base()
    data["source"].update(source_update)
    if data["source"].get("topics") is None:
        data["source"].pop("topics", None)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as error:
        load_spec(path)
    text = str(error.value)
    assert text.startswith("demo.yaml: field 'source")
    assert message in text
    assert "\n" not in text


def test_startup_mode_applies_to_the_first_plan_only():
    spec = source(startup="latest")
    assert plan_batch({}, LOW, HIGH, spec).starts == HIGH
    later = plan_batch({T0: 100}, LOW, HIGH, spec)
    assert later.starts[T1] == 0 and later.startup[T1] == "earliest: found after the pipeline started"
