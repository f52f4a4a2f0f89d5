"""Where the stage's read time goes: the same ranges, in one Spark session, measured step by step.

spark-submit stage_profile.py RANGES_JSON REPS   (env MICROBATCH_KAFKA_BOOTSTRAP); prints BENCH:{json}.
Each step is one Spark action over the whole range; the last repetition is the steady state (JIT warm).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from microbatch.planning import OffsetRange
from microbatch.staging import kafka_read_options
from spark_jobs.ip_count import transform


def steps(spark: SparkSession, options: dict[str, str]) -> dict[str, float]:
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
    cached = parsed().withColumn("value", F.when(F.col("error").isNotNull() | F.col("late"), F.col("value")))
    cached = cached.persist(StorageLevel.MEMORY_AND_DISK)
    out["5 read + parse + persist + count (stage's read)"] = timed(cached.count)
    out["6 aggregate from the cache (stage's write, less JDBC)"] = timed(lambda: transform.outputs(
        cached.where(F.col("error").isNull() & ~F.col("late")), {}, {})["ip_counts"].write.format("noop")
        .mode("overwrite").save())
    cached.unpersist(blocking=True)
    return out


def main(argv: list[str]) -> int:
    ranges = [OffsetRange(**r) for r in json.loads(Path(argv[0]).read_text())]
    reps = int(argv[1])
    spark = SparkSession.builder.appName("bench-stage-profile").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    options = kafka_read_options(ranges, os.environ["MICROBATCH_KAFKA_BOOTSTRAP"], "read_committed")
    runs = [steps(spark, options) for _ in range(reps)]
    print("BENCH:" + json.dumps({"runs": runs}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
