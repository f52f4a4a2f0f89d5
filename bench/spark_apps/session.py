"""The session of a benchmark app: a Spark Connect client of SPARK_REMOTE when it is set (the app then runs as a
plain Python client of that warm server), else the spark-submit application's own session."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from microbatch.phases.stage import read_kafka_through_v2


def bench_session(app_name: str) -> tuple[SparkSession, bool]:
    """(the session, whether it is a Connect client). A Connect client leaves the shared server running: do not
    stop its session. Its batch reads of Kafka go through the V2 scan, as the stage's do (the peer's streaming
    read always does)."""
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", "4")  # what the spark-submit runs get by --conf
    else:
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
    read_kafka_through_v2(spark)
    return spark, bool(remote)
