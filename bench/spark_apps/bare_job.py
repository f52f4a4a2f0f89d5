"""b2: the ip_count job's Spark work with no ledger: read exactly the given ranges (the stage's read options),
parse, keep the valid records, aggregate per window and IP as the job does, and write to Spark's `noop` sink.
The difference between this and microbatch's stage + commit is the exactly-once machinery: the ledger, the
observed counts, the staging write and the commit.

spark-submit bare_job.py RANGES_JSON [observed]   (env MICROBATCH_KAFKA_BOOTSTRAP); prints BENCH:{json}.
With `observed`, the parsed records also carry the stage's observed metrics (records per partition, dead letters,
late records, the watermark): b2o, which tells their cost apart from the ledger's.
With SPARK_REMOTE=sc://... it runs as a plain Python Spark Connect client of that server instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

STARTED = time.time()

from pyspark.sql import Observation  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from session import bench_session  # noqa: E402

from microbatch.phases.stage import kafka_read_options, read_metrics, with_pooled_consumers  # noqa: E402
from microbatch.types import OffsetRange  # noqa: E402
from spark_jobs.ip_count import transform  # noqa: E402

OPTIONS = {"window_seconds": 5, "allowed_lateness_seconds": 5}


def main(argv: list[str]) -> int:
    ranges = [OffsetRange(**r) for r in json.loads(Path(argv[0]).read_text())]
    spark, remote = bench_session("bench-bare-job")
    ready = time.time()
    options = kafka_read_options(ranges, os.environ["MICROBATCH_KAFKA_BOOTSTRAP"], "read_committed")
    t0 = time.monotonic()
    records = spark.read.format("kafka").options(**with_pooled_consumers(options)).load()
    parsed = transform.parse(records, OPTIONS, {})
    observation = Observation("bare")
    if argv[1:] == ["observed"]:
        keys = sorted({(r.topic, r.partition) for r in ranges})
        parsed = parsed.observe(observation, *[e.alias(k) for k, e in read_metrics(transform, OPTIONS, keys).items()])
    valid = parsed.where(F.col("error").isNull() & ~F.col("late"))
    transform.outputs(valid, OPTIONS, {})["ip_counts"].write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - t0
    observed = observation.get if argv[1:] == ["observed"] else {}
    print("BENCH:" + json.dumps({"job_s": round(seconds, 3), "observed": {k: str(v) for k, v in observed.items()},
                                 "python_start": STARTED, "session_ready": ready}),
          flush=True)
    if not remote:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
