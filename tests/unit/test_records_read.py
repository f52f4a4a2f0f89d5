"""The exact records per source partition from the stage's observed total (phases.stage_records.records_read)."""

from __future__ import annotations

import pytest

from microbatch.errors import StageFailedError
from microbatch.phases.stage_records import planned_by_partition, records_read
from microbatch.types import OffsetRange

PLANNED = planned_by_partition([OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 8), OffsetRange("u", 0, 0, 4),
                                OffsetRange("t", 0, 20, 25)])


def test_planned_offsets_add_up_per_partition():
    assert PLANNED == {"t[0]": 15, "t[1]": 3, "u[0]": 4}


def test_a_total_equal_to_the_planned_offsets_gives_each_partition_its_ranges():
    assert records_read(22, PLANNED, None) == PLANNED


def test_fewer_records_without_counters_asks_for_a_count():
    assert records_read(21, PLANNED, None) is None


def test_counts_that_add_up_to_the_total_are_taken_and_missing_partitions_read_zero():
    assert records_read(17, PLANNED, {"t[0]": 12, "t[1]": 3, "u[0]": 2}) == {"t[0]": 12, "t[1]": 3, "u[0]": 2}
    assert records_read(15, PLANNED, {"t[0]": 15}) == {"t[0]": 15, "t[1]": 0, "u[0]": 0}


@pytest.mark.parametrize("observed, counted", [
    (23, None),  # more records than offsets: a task counted twice
    (17, {"t[0]": 11, "t[1]": 3, "u[0]": 2}),  # the second read found fewer: records removed in between
    (19, {"t[0]": 11, "t[1]": 3, "u[0]": 4, "v[0]": 1}),  # records of a partition the batch does not read
    (20, {"t[0]": 12, "t[1]": 4, "u[0]": 4}),  # more records in t[1] than its range holds
])
def test_counts_the_ledger_cannot_vouch_for_are_refused_and_retried(observed, counted):
    with pytest.raises(StageFailedError) as error:
        records_read(observed, PLANNED, counted)
    assert error.value.retryable
    assert "do not add up" in str(error.value)
