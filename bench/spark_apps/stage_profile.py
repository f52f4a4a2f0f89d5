"""Where the stage's read time goes: the same ranges, in one Spark session, measured step by step.

spark-submit stage_profile.py RANGES_JSON REPS   prints BENCH:{json}
env: MICROBATCH_KAFKA_BOOTSTRAP, and MICROBATCH_LEDGER_URL for step 6 (the JDBC staging write).
Each step is one Spark action over the whole range; the last repetition is the steady state (JIT warm).
Each step's CPU seconds are those of the application's JVM (driver and, in local mode, the executors), read
from the OS around the action.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from microbatch.ledger.database import Ledger
from microbatch.phases.stage import V1_SOURCE_LIST, jdbc_options, kafka_read_options, read_kafka_through_v2
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange
from spark_jobs.ip_count import transform


def steps(spark: SparkSession, options: dict[str, str], ledger: str | None) -> tuple[dict, dict]:
    """(wall seconds, JVM CPU seconds) of each step."""
    def records():
        return spark.read.format("kafka").options(**options).load()

    def parsed():
        return transform.parse(records(), {}, {})

    jvm = psutil.Process(os.getppid())  # spark-submit's JVM started this Python driver
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def timed(step: str, action) -> None:
        c0, t0 = sum(jvm.cpu_times()[:2]), time.monotonic()
        action()
        wall[step] = round(time.monotonic() - t0, 3)
        cpu[step] = round(sum(jvm.cpu_times()[:2]) - c0, 3)

    def stage_pass(write) -> None:
        """What the stage runs for one sink: read, parse, observe the counts, aggregate, write."""
        observed = parsed().observe(Observation(), F.count(F.lit(1)).alias("records"),
                                    F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("dead"),
                                    F.max("event_time").alias("max_event_time"))
        out = transform.outputs(observed.where(F.col("error").isNull() & ~F.col("late")), {}, {})["ip_counts"]
        write(out.select(F.lit(1).cast("bigint").alias("batch_id"), F.lit(1).alias("attempt"), "topic", "partition",
                         "window_start", "window_end", "ip", "count"))

    def noop(df) -> None:
        df.write.format("noop").mode("overwrite").save()

    timed("1 read + count()", lambda: records().count())
    timed("2 read + touch every value", lambda: records().agg(F.sum(F.length("value"))).collect())
    timed("3 read + parse (ip, time, error)", lambda: parsed().agg(
        F.count(F.when(F.col("error").isNull(), 1)), F.max("event_time"), F.max(F.length("ip"))).collect())
    timed("4 read + parse + aggregate (no cache)", lambda: noop(transform.outputs(
        parsed().where(F.col("error").isNull() & ~F.col("late")), {}, {})["ip_counts"]))
    timed("5 the stage's pass, no JDBC (observe + aggregate)", lambda: stage_pass(noop))
    spark.conf.set(V1_SOURCE_LIST, "kafka")  # as Spark's default list: Kafka through the V1 relation
    timed("5v1 step 5, Kafka read through the V1 relation (Spark's default)", lambda: stage_pass(noop))
    spark.conf.unset(V1_SOURCE_LIST)
    read_kafka_through_v2(spark)
    if ledger:
        jdbc = jdbc_options(Ledger(ledger))
        timed("6 the stage's pass with its JDBC staging write", lambda: stage_pass(
            lambda df: df.write.format("jdbc").options(**jdbc).option("dbtable", "stage_ip_counts").mode("append")
            .save()))
    return wall, cpu


def main(argv: list[str]) -> int:
    ranges = [OffsetRange(**r) for r in json.loads(Path(argv[0]).read_text())]
    reps = int(argv[1])
    spark = SparkSession.builder.appName("bench-stage-profile").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    read_kafka_through_v2(spark)  # the stage's read
    options = kafka_read_options(ranges, KafkaSettings(os.environ["MICROBATCH_KAFKA_BOOTSTRAP"]), "read_committed")
    runs = [steps(spark, options, os.environ.get("MICROBATCH_LEDGER_URL")) for _ in range(reps)]
    print("BENCH:" + json.dumps({"runs": [wall for wall, _ in runs], "cpu": [cpu for _, cpu in runs]}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
