"""Backfill planning, pure: holes, what is skipped, what is left to the scheduled runs, layers, params."""

from datetime import UTC, datetime

import pytest

from microbatch.config import find_spec
from microbatch.errors import SpecError
from microbatch.phases.backfill import form_params, parse_params
from microbatch.planning import layers, open_overlaps, plan_fill, plan_replay, subtract
from microbatch.types import CommittedRange, OffsetRange, TopicPartition

T0 = TopicPartition("t", 0)


def r(partition: int, start: int, end: int) -> OffsetRange:
    return OffsetRange("t", partition, start, end)


def test_subtract_finds_the_holes():
    assert subtract(r(0, 0, 100), [r(0, 10, 20), r(0, 30, 40), r(1, 0, 100)]) == [r(0, 0, 10), r(0, 20, 30),
                                                                                     r(0, 40, 100)]
    assert subtract(r(0, 10, 20), [r(0, 0, 100)]) == []


def test_fill_skips_committed_and_leaves_offsets_after_the_position_to_the_scheduled_runs():
    plan = plan_fill([r(0, 0, 120)], [r(0, 50, 80)], {T0: 100})
    assert plan.todo == [r(0, 0, 50), r(0, 80, 100)]
    assert plan.already_committed == [r(0, 50, 80)]
    assert plan.ahead_of_position == [r(0, 100, 120)]
    assert plan.records == 70


def test_fill_of_an_unseen_partition_does_nothing_yet():
    plan = plan_fill([r(3, 0, 10)], [], {})
    assert plan.todo == [] and plan.ahead_of_position == [r(3, 0, 10)]


def test_layers_hold_one_range_per_partition():
    groups = layers([r(0, 0, 5), r(0, 10, 15), r(1, 0, 5)])
    assert groups == [[r(0, 0, 5), r(1, 0, 5)], [r(0, 10, 15)]]


def test_params_are_validated_with_the_field_named():
    spec = find_spec("ip_count")
    params = parse_params(spec, {"topic": "ip_count_source", "start": "5", "end": 9, "partitions": [0, 1]})
    assert (params.start, params.end, params.partitions, params.mode) == (5, 9, [0, 1], "fill")
    times = parse_params(spec, {"topic": "ip_count_source", "start": "2026-11-22T12:00:00Z",
                                "end": "2026-11-22T12:01:00+00:00"})
    assert times.start == datetime(2026, 11, 22, 12, tzinfo=UTC)
    with pytest.raises(SpecError, match="Backfill parameter 'topic': 'nope' is not a topic of pipeline ip_count"):
        parse_params(spec, {"topic": "nope", "start": 0, "end": 5})
    with pytest.raises(SpecError, match="Backfill parameter 'end': must be greater than start"):
        parse_params(spec, {"topic": "ip_count_source", "start": 9, "end": 5})
    with pytest.raises(SpecError, match="Backfill parameter 'end': start and end must both be offsets or both"):
        parse_params(spec, {"topic": "ip_count_source", "start": 0, "end": "2026-11-22T12:00:00Z"})
    with pytest.raises(SpecError, match="Backfill parameter 'colour'"):
        parse_params(spec, {"topic": "ip_count_source", "start": 0, "end": 5, "colour": "red"})
    with pytest.raises(SpecError, match="Backfill parameter 'mode'"):
        parse_params(spec, {"topic": "ip_count_source", "start": 0, "end": 5, "mode": "redo"})
    with pytest.raises(SpecError, match="Backfill parameter 'start': an offset is at least 0"):
        parse_params(spec, {"topic": "ip_count_source", "start": -1, "end": "latest"})
    latest = parse_params(spec, {"topic": "ip_count_source", "start": 0, "end": "latest", "mode": "replay"})
    assert (latest.end, latest.mode) == ("latest", "replay")


def test_the_trigger_forms_fields_read_back_as_the_same_params():
    """The form has one JSON type per field (issue 45): offsets are numbers, times are `start_time`/`end_time`, no
    `end` is latest, partitions are text; they validate as the model's own values do."""
    spec = find_spec("ip_count")
    form = {"topic": "ip_count_source", "mode": "fill", "dry_run": False}
    offsets = parse_params(spec, {**form, "partitions": " 0, 2 ", "start": 3, "end": 9})
    assert (offsets.start, offsets.end, offsets.partitions) == (3, 9, [0, 2])
    latest = parse_params(spec, {**form, "partitions": "all", "start": 0, "end": None, "start_time": None})
    assert (latest.start, latest.end, latest.partitions) == (0, "latest", "all")
    times = parse_params(spec, {**form, "start": 0, "start_time": "2026-11-22T12:00:00Z",
                                "end_time": "2026-11-22T12:01:00Z"})
    assert (times.start, times.end) == (datetime(2026, 11, 22, 12, tzinfo=UTC),
                                        datetime(2026, 11, 22, 12, 1, tzinfo=UTC))
    with pytest.raises(SpecError, match="Backfill parameter 'partitions': '0; 2' is not \"all\" or partition"):
        parse_params(spec, {**form, "partitions": "0; 2", "start": 0})
    with pytest.raises(SpecError, match="Backfill parameter 'start_time': give the start as an offset or as a time"):
        parse_params(spec, {**form, "start": 5, "start_time": "2026-11-22T12:00:00Z"})
    with pytest.raises(SpecError, match="Backfill parameter 'end': start and end must both be offsets or both"):
        parse_params(spec, {**form, "start": 0, "end_time": "2026-11-22T12:00:00Z"})
    with pytest.raises(SpecError, match="Backfill parameter 'end': must be greater than start"):
        parse_params(spec, {**form, "start": 9, "end": 5})
    # The CLI's text becomes the form's values.
    assert form_params("t", "5", "latest", "0, 2", "replay", True) == {
        "topic": "t", "partitions": "0, 2", "mode": "replay", "dry_run": True, "start": 5}
    assert form_params("t", "2026-11-22T12:00:00Z", "2026-11-22T13:00:00Z", "all", "fill", False) == {
        "topic": "t", "partitions": "all", "mode": "fill", "dry_run": False,
        "start_time": "2026-11-22T12:00:00Z", "end_time": "2026-11-22T13:00:00Z"}


def test_replay_is_widened_to_whole_committed_ranges_one_batch_per_original():
    committed = [CommittedRange(1, 10, r(0, 0, 100)), CommittedRange(2, 10, r(1, 0, 90)),
                 CommittedRange(3, 11, r(0, 100, 250)), CommittedRange(4, 12, r(0, 250, 300))]
    plan = plan_replay([r(0, 50, 120)], committed)
    assert [c.range_id for c in plan.replace] == [1, 3]
    assert plan.widened == [(r(0, 50, 120), r(0, 0, 250))]
    assert plan.never_committed == []
    assert plan.records == 250
    assert {b: [c.range for c in cs] for b, cs in plan.by_batch().items()} == {10: [r(0, 0, 100)],
                                                                               11: [r(0, 100, 250)]}
    exact = plan_replay([r(0, 100, 250)], committed)
    assert exact.widened == [] and [c.range_id for c in exact.replace] == [3]


def test_with_contributions_per_batch_a_replay_takes_every_partition_of_each_batch_it_touches():
    committed = [CommittedRange(1, 10, r(0, 0, 100)), CommittedRange(2, 10, r(1, 0, 90)),
                 CommittedRange(3, 11, r(0, 100, 250)), CommittedRange(5, 11, r(1, 90, 95)),
                 CommittedRange(4, 12, r(0, 250, 300)), CommittedRange(6, 12, r(2, 0, 7))]
    plan = plan_replay([r(0, 50, 120)], committed, whole_batches=True)
    assert [c.range_id for c in plan.whole_batches] == [2, 5]  # batch 12 is not touched
    assert sorted(c.range_id for c in plan.replace) == [1, 2, 3, 5]
    assert plan.records == 250 + 90 + 5
    assert {b: [c.range for c in cs] for b, cs in plan.by_batch().items()} == {
        10: [r(0, 0, 100), r(1, 0, 90)], 11: [r(0, 100, 250), r(1, 90, 95)]}
    whole = plan_replay([r(0, 0, 100), r(1, 0, 90)], committed, whole_batches=True)
    assert whole.whole_batches == [] and sorted(c.range_id for c in whole.replace) == [1, 2]


def test_replay_reports_offsets_never_committed():
    plan = plan_replay([r(0, 250, 400), r(2, 0, 5)], [CommittedRange(4, 12, r(0, 250, 300))])
    assert plan.never_committed == [r(0, 300, 400), r(2, 0, 5)]


def test_a_range_overlapping_an_open_batch_is_found():
    open_ranges = [(7, "staged", r(0, 100, 200)), (8, "planned", r(1, 0, 10))]
    assert open_overlaps([r(0, 150, 160), r(1, 10, 20)], open_ranges) == [(r(0, 150, 160), 7, "staged")]
