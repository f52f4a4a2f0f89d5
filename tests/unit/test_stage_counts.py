"""The stage's records per source partition, read back from the observed histogram (phases/stage.py): pure
parts, without Spark. tests/integration/test_source_semantics.py checks the counts Spark observes."""

from __future__ import annotations

import pytest

from microbatch.errors import MicrobatchError
from microbatch.phases.stage import partition_places, records_by_partition

ONE_TOPIC = [("clicks", 0), ("clicks", 1), ("clicks", 5)]
TWO_TOPICS = [("a", 0), ("a", 3), ("b", 0), ("b", 2)]


def bins(*pairs: tuple[float, float]) -> list[dict[str, float]]:
    return [{"x": x, "y": y} for x, y in pairs]


def test_one_topic_indexes_by_partition_number():
    assert partition_places(ONE_TOPIC) == {"clicks": 0}
    values = {"records": 12, "records_by_partition": bins((0, 5.0), (5, 7.0))}
    assert records_by_partition(values, ONE_TOPIC) == {"clicks[0]": 5, "clicks[1]": 0, "clicks[5]": 7}


def test_several_topics_are_offset_past_the_highest_partition():
    assert partition_places(TWO_TOPICS) == {"a": 0, "b": 4}
    values = {"records": 10, "records_by_partition": bins((3, 1.0), (4, 2.0), (6, 7.0))}
    assert records_by_partition(values, TWO_TOPICS) == {"a[0]": 0, "a[3]": 1, "b[0]": 2, "b[2]": 7}


def test_bins_of_one_partition_from_several_tasks_add_up():
    values = {"records": 9, "records_by_partition": bins((1, 4.0), (1, 5.0))}
    assert records_by_partition(values, ONE_TOPIC)["clicks[1]"] == 9


def test_no_records_gives_zeros():
    assert records_by_partition({"records": 0, "records_by_partition": None}, ONE_TOPIC) == {
        "clicks[0]": 0, "clicks[1]": 0, "clicks[5]": 0}


@pytest.mark.parametrize("bad", [bins((2, 3.0)), bins((0.5, 3.0)), bins((0, 2.5))])
def test_a_bin_that_names_no_partition_of_the_batch_is_refused(bad):
    with pytest.raises(MicrobatchError, match="names no partition of the batch"):
        records_by_partition({"records": 3, "records_by_partition": bad}, ONE_TOPIC)


def test_counts_that_do_not_add_up_to_the_records_are_refused():
    with pytest.raises(MicrobatchError, match="counted 10 records but 9"):
        records_by_partition({"records": 10, "records_by_partition": bins((0, 9.0))}, ONE_TOPIC)
