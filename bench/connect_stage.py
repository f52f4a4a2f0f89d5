"""The stage phase through Spark Connect: the same staging.stage_batch, on a session of a long-lived
Spark Connect server (SPARK_REMOTE=sc://HOST:PORT), so no JVM starts per batch. Prototype for bench/latency.py.

    SPARK_REMOTE=sc://127.0.0.1:15002 connect_stage.py PIPELINE BATCH_ID   -> BENCH:{json}
"""

from __future__ import annotations

import json
import sys
import time

STARTED = time.monotonic()

from pyspark.sql import SparkSession  # noqa: E402

from microbatch.config import find_spec  # noqa: E402
from microbatch.kafka_offsets import bootstrap_from_env  # noqa: E402
from microbatch.ledger.database import ledger_url_from_env  # noqa: E402
from microbatch.staging import stage_batch  # noqa: E402


def main(argv: list[str]) -> int:
    imported = time.monotonic() - STARTED
    spec = find_spec(argv[0])
    t0 = time.monotonic()
    spark = SparkSession.builder.getOrCreate()  # a Connect session: SPARK_REMOTE is set
    connected = time.monotonic() - t0
    for key, value in spec.spark.conf.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    t1 = time.monotonic()
    result = stage_batch(spark, spec, int(argv[1]), ledger_url_from_env(), bootstrap_from_env())
    staged = time.monotonic() - t1
    print("BENCH:" + json.dumps({"import_s": round(imported, 3), "connect_s": round(connected, 3),
                                 "stage_s": round(staged, 3), "records": result.records if result else 0,
                                 "timings": result.timings if result else {}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
