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
