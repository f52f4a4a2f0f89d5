"""Where the stage's read time goes: the same ranges, in one Spark session, measured step by step.

spark-submit stage_profile.py RANGES_JSON REPS   prints BENCH:{json}
env: MICROBATCH_KAFKA_BOOTSTRAP, and MICROBATCH_LEDGER_URL for step 6 (the JDBC staging write).
Each step is one Spark action over the whole range; the last repetition is the steady state (JIT warm).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from microbatch.phases.stage import jdbc_options, kafka_read_options, read_kafka_through_v2
from microbatch.types import OffsetRange
from spark_jobs.ip_count import transform


def steps(spark: SparkSession, options: dict[str, str], ledger: str | None) -> dict[str, float]:
    def records():
        return spark.read.format("kafka").options(**options).load()

    def parsed():
        return transform.parse(records(), {}, {})

    def timed(action) -> float:
        t0 = time.monotonic()
        action()
        return round(time.monotonic() - t0, 3)

    out: dict[str, float] = {}
    out["1 read + count()"] = timed(lambda: records().count())
    out["2 read + touch every value"] = timed(lambda: records().agg(F.sum(F.length("value"))).collect())
    out["3 read + parse (ip, time, error)"] = timed(lambda: parsed().agg(
        F.count(F.when(F.col("error").isNull(), 1)), F.max("event_time"), F.max(F.length("ip"))).collect())
    out["4 read + parse + aggregate (no cache)"] = timed(lambda: transform.outputs(
        parsed().where(F.col("error").isNull() & ~F.col("late")), {}, {})["ip_counts"].write.format("noop")
        .mode("overwrite").save())
    def stage_pass(write) -> None:
        """What the stage runs for one sink: read, parse, observe the counts, aggregate, write."""
        observed = parsed().observe(Observation(), F.count(F.lit(1)).alias("records"),
                                    F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("dead"),
                                    F.max("event_time").alias("max_event_time"))
        out = transform.outputs(observed.where(F.col("error").isNull() & ~F.col("late")), {}, {})["ip_counts"]
        write(out.select(F.lit(1).cast("bigint").alias("batch_id"), F.lit(1).alias("attempt"), "topic", "partition",
                         "window_start", "window_end", "ip", "count"))

    out["5 the stage's pass, no JDBC (observe + aggregate)"] = timed(
        lambda: stage_pass(lambda df: df.write.format("noop").mode("overwrite").save()))
    if ledger:
        jdbc = jdbc_options(ledger)
        out["6 the stage's pass with its JDBC staging write"] = timed(lambda: stage_pass(
            lambda df: df.write.format("jdbc").options(**jdbc).option("dbtable", "stage_ip_counts").mode("append")
            .save()))
    return out


def main(argv: list[str]) -> int:
    ranges = [OffsetRange(**r) for r in json.loads(Path(argv[0]).read_text())]
    reps = int(argv[1])
    spark = SparkSession.builder.appName("bench-stage-profile").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    read_kafka_through_v2(spark)  # the stage's read
    options = kafka_read_options(ranges, os.environ["MICROBATCH_KAFKA_BOOTSTRAP"], "read_committed")
    runs = [steps(spark, options, os.environ.get("MICROBATCH_LEDGER_URL")) for _ in range(reps)]
    print("BENCH:" + json.dumps({"runs": runs}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
