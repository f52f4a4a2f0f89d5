"""A Python job's `event_time` column must be a timestamp (issue 59): the stage refuses any other type in one
sentence, before anything is written (`event_time.check_event_time_column`, on real Spark)."""

from __future__ import annotations

import pytest

from microbatch.errors import SpecError
from microbatch.event_time import check_event_time_column

pytestmark = pytest.mark.integration


def test_a_jobs_event_time_must_be_a_timestamp(spark):
    from pyspark.sql import functions as F

    rows = spark.range(3)
    for good in (F.timestamp_millis(F.col("id")), F.lit(None), F.timestamp_millis(F.col("id")).cast("timestamp_ntz")):
        check_event_time_column(rows.select(good.alias("event_time")), "payments")
    check_event_time_column(rows, "payments")  # a job without event time
    with pytest.raises(SpecError) as refused:
        check_event_time_column(rows.select((F.col("id") * 1000).alias("event_time")), "payments")
    assert str(refused.value).startswith("payments: the job's event_time column is bigint, not a timestamp; nothing "
                                         "was written. Return a timestamp: for epoch milliseconds")
    assert not refused.value.retryable


def test_a_record_too_far_ahead_is_a_dead_letter_and_moves_no_watermark(spark):
    """`guard_future` through `with_late`: against the Kafka timestamp when the rows carry it, else the batch's
    planned time; a record a day ahead (or past year 9999) gets the reason, is neither late nor counted in the
    watermark's metric; the others are untouched, and a reason the job gave stays."""
    from pyspark.sql import functions as F

    from microbatch.event_time import PLANNED_OPTION, watermark_metrics, with_late

    kafka_ms = 1_795_939_200_000  # 2026-11-29T08:00:00Z
    rows = spark.createDataFrame(
        [(1, kafka_ms - 3_600_000, None), (2, kafka_ms + 3_600_000, None), (3, 32_503_680_000_000, None),
         (4, 1_764_000_000_000_000, None), (5, 32_503_680_000_000, "the job's own reason")],
        "n int, event_ms bigint, error string")
    with_kafka = rows.select("n", F.timestamp_millis(F.lit(kafka_ms)).alias("timestamp"),
                             F.timestamp_millis("event_ms").alias("event_time"), "error")
    checked = with_late(with_kafka, 60, {}, {})
    got = {r["n"]: r["error"] for r in checked.select("n", "error").collect()}
    assert got[1] is None and got[2] is None, got
    assert got[3] == ("the event time is more than 1 day ahead of its Kafka timestamp (max_future); it would move "
                      "the watermark past every later record")
    assert got[4] == "the event time is past year 9999, which no watermark holds"
    assert got[5] == "the job's own reason"
    metrics = checked.select(*[c.alias(k) for k, c in watermark_metrics().items()]).collect()[0]
    assert metrics["max_event_time"] == (kafka_ms + 3_600_000) * 1000, "the guarded records move nothing"

    planned = with_kafka.drop("timestamp")
    guarded = with_late(planned, 60, {}, {PLANNED_OPTION: kafka_ms * 1000, "max_future_seconds": 1800})
    got = {r["n"]: r["error"] for r in guarded.select("n", "error").collect()}
    assert got[2] == ("the event time is more than 30 minutes ahead of its batch's planned time (max_future); it "
                      "would move the watermark past every later record")
    assert got[1] is None
    assert with_late(planned, 60, {}).where(F.col("error").isNull()).count() == 4, "no options: no guard"
