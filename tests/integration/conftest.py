"""One local Spark for the integration tests that run Spark in the test process.

A JVM started by pyspark keeps the classpath of its first session: a second session with `spark.jars`
in the same process does not get Spark's Kafka source. So every in-process test shares this session,
started once with the connector jars.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    from microbatch.runtime import spark_jars

    session = (SparkSession.builder.master("local[2]").appName("microbatch-integration")
               .config("spark.jars", ",".join(str(p) for p in spark_jars()))
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
