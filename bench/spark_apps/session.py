"""The session of a benchmark app: a Spark Connect client of SPARK_REMOTE when it is set (the app then runs as a
plain Python client of that warm server), else the spark-submit application's own session."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession


def bench_session(app_name: str) -> tuple[SparkSession, bool]:
    """(the session, whether it is a Connect client). A Connect client leaves the shared server running: do not
    stop its session."""
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", "4")  # what the spark-submit runs get by --conf
        return spark, True
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark, False
