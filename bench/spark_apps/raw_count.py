"""Spark's limit: read exactly the given ranges with the Kafka source (the options stage uses) and count().

spark-submit raw_count.py RANGES_JSON   (env MICROBATCH_KAFKA_BOOTSTRAP); prints BENCH:{json}.
With SPARK_REMOTE=sc://... it runs as a plain Python Spark Connect client of that server instead.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

STARTED = time.time()

from session import bench_session  # noqa: E402

from microbatch.phases.stage import kafka_read_options  # noqa: E402
from microbatch.settings import KafkaSettings  # noqa: E402
from microbatch.types import OffsetRange  # noqa: E402


def main(argv: list[str]) -> int:
    import os

    ranges = [OffsetRange(**r) for r in json.loads(Path(argv[0]).read_text())]
    spark, remote = bench_session("bench-raw-count")
    ready = time.time()
    options = kafka_read_options(ranges, KafkaSettings(os.environ["MICROBATCH_KAFKA_BOOTSTRAP"]), "read_committed")
    t0 = time.monotonic()
    count = spark.read.format("kafka").options(**options).load().count()
    seconds = time.monotonic() - t0
    print("BENCH:" + json.dumps({"count": count, "count_s": round(seconds, 3),
                                 "python_start": STARTED, "session_ready": ready}), flush=True)
    if not remote:  # a Connect client leaves the shared server running
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
