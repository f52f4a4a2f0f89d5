"""The watermark reaches the records' generated code as a run-time value (`transform.batch_constant`), on a local
Spark: `with_late` flags exactly the records an independent oracle calls late, whatever the watermark, and the
code Spark generates for the records is the same for two watermarks, so a new batch reuses it. The same plan with
`F.lit` generates different code for each watermark: the check can tell the two apart."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from microbatch.transform import batch_constant
from spark_jobs.event_time import MICROS, with_late

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
WIDTH = 5


ROWS = [(T0 + timedelta(seconds=s), "bad" if s % 7 == 3 else None) for s in range(40)]  # (event_time, error)


def checked(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(ROWS, "event_time timestamp, error string")


def oracle(watermark_us: int) -> list[tuple[datetime, bool]]:
    """(event time, late) of each row: good, and its window ends at or before the watermark."""
    return [(t, error is None and (int(t.timestamp()) // WIDTH * WIDTH + WIDTH) * MICROS <= watermark_us)
            for t, error in ROWS]


def generated_code(spark: SparkSession, df: DataFrame) -> str:
    """The Java code Spark generated for `df`'s executed plan (what its cache of compiled code is keyed by),
    without comments."""
    df.collect()  # runs the watermark's subquery, whose value the code generation reads
    code = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenString(
        df._jdf.queryExecution().executedPlan())
    java = "".join(part.split("== Subtree")[0] for part in code.split("Generated code:")[1:])
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", java, flags=re.S))


def late_count(frame: DataFrame) -> DataFrame:
    """A plan over the records: filter the late ones, count them."""
    return frame.where(F.col("late")).groupBy().count()


def test_late_flags_match_the_oracle_and_the_generated_code_does_not_change_with_the_watermark(
        spark: SparkSession) -> None:
    # Watermarks before, inside and after the 40 seconds of records, and on a window's end exactly.
    watermarks = [int((T0 + timedelta(seconds=s)).timestamp()) * MICROS for s in (-10, 10, 12, 25, 100)]
    for watermark in watermarks:
        got = sorted((r["event_time"].astimezone(UTC), r["late"]) for r in
                     with_late(checked(spark), WIDTH, {"watermark_us": watermark}).collect())
        assert got == oracle(watermark), f"late flags wrong at watermark {watermark}"

    # Two batches' watermarks, both inside the records: the same generated code, through batch_constant.
    first, second = watermarks[1], watermarks[3]
    with_constant = [generated_code(spark, late_count(with_late(checked(spark), WIDTH, {"watermark_us": w})))
                     for w in (first, second)]
    assert with_constant[0] == with_constant[1]
    assert "references[" in with_constant[0]

    def with_literal(w: int) -> DataFrame:
        """The late flag as `F.lit` builds it."""
        end_us = (F.floor(F.unix_seconds("event_time") / WIDTH) * WIDTH + WIDTH) * MICROS
        return checked(spark).select("*", (F.col("error").isNull() & (end_us <= F.lit(w))).alias("late"))

    literal = [generated_code(spark, late_count(with_literal(w))) for w in (first, second)]
    assert literal[0] != literal[1], "a literal watermark no longer changes the generated code: the check is moot"
    assert f"{second}L" in literal[1] and f"{second}L" not in with_constant[1]


def test_batch_constant_is_the_value(spark: SparkSession) -> None:
    df = spark.range(3)
    value = 1_795_000_000_123_456
    assert [r["v"] for r in df.select(batch_constant(df, value).alias("v")).collect()] == [value] * 3
