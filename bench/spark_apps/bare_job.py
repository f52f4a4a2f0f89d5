"""b2: the ip_count job's Spark work with no ledger: read exactly the given ranges (the stage's read options),
parse, keep the valid records, aggregate per window and IP as the job does, and write to Spark's `noop` sink.
The difference between this and microbatch's stage + commit is the exactly-once machinery: the ledger, the
observed counts, the staging write and the commit.

spark-submit bare_job.py RANGES_JSON [observed] [--batch-records N]   (env MICROBATCH_KAFKA_BOOTSTRAP);
prints BENCH:{json}.
With `observed`, the parsed records also carry the stage's observed metrics (records per partition, dead letters,
late records, the watermark): b2o, which tells their cost apart from the ledger's.
With `--batch-records N`, the ranges are cut into batches of N records as microbatch's planner cuts them
(`planning.plan_ranges`, the share of each partition as `maxOffsetsPerTrigger`'s), and the job runs once per batch,
one after the other in the same application (b2_split): the bare job in batches, the most any engine that runs
this job per batch could reach.
With SPARK_REMOTE=sc://... it runs as a plain Python Spark Connect client of that server instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

STARTED = time.time()

from pyspark.sql import Observation, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from session import bench_session  # noqa: E402

from microbatch.phases.stage import kafka_read_options, read_metrics, with_pooled_consumers  # noqa: E402
from microbatch.planning import plan_ranges  # noqa: E402
from microbatch.settings import KafkaSettings  # noqa: E402
from microbatch.types import OffsetRange  # noqa: E402
from spark_jobs.ip_count import transform  # noqa: E402

OPTIONS = {"window_seconds": 5, "allowed_lateness_seconds": 5}


def batches(ranges: list[OffsetRange], batch_records: int) -> list[list[OffsetRange]]:
    """`ranges` cut into consecutive batches of at most `batch_records` records, as microbatch plans them."""
    if not batch_records:
        return [ranges]
    starts = {r.tp: r.start for r in ranges}
    ends = {r.tp: r.end for r in ranges}
    cut: list[list[OffsetRange]] = []
    while True:
        batch, _ = plan_ranges(starts, ends, batch_records)
        if not batch:
            return cut
        cut.append(batch)
        starts.update({r.tp: r.end for r in batch})


def run_bare_job(spark: SparkSession, batch: list[OffsetRange], bootstrap: str,
                 observation: Observation | None = None, only_count: bool = False) -> None:
    """One batch of the bare job: read exactly `batch`, parse, aggregate, write to `noop`; with `observation`,
    the stage's observed metrics ride along (b2o), or with `only_count` a single count (b2o1)."""
    options = kafka_read_options(batch, KafkaSettings(bootstrap), "read_committed")
    records = spark.read.format("kafka").options(**with_pooled_consumers(options)).load()
    parsed = transform.parse(records, OPTIONS, {})
    if observation is not None:
        keys = sorted({(r.topic, r.partition) for r in batch})
        metrics = ({"records": F.count(F.lit(1))} if only_count
                   else read_metrics(transform, OPTIONS, keys, count_partitions=True))
        parsed = parsed.observe(observation, *[e.alias(k) for k, e in metrics.items()])
    valid = parsed.where(F.col("error").isNull() & ~F.col("late"))
    transform.outputs(valid, OPTIONS, {})["ip_counts"].write.format("noop").mode("overwrite").save()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ranges", type=Path)
    parser.add_argument("observed", nargs="?", choices=["observed"])
    parser.add_argument("--batch-records", type=int, default=0)
    args = parser.parse_args(argv)
    ranges = [OffsetRange(**r) for r in json.loads(args.ranges.read_text())]
    spark, remote = bench_session("bench-bare-job")
    ready = time.time()
    bootstrap = os.environ["MICROBATCH_KAFKA_BOOTSTRAP"]
    observed: dict = {}
    job_seconds: list[float] = []
    for batch in batches(ranges, args.batch_records):
        t0 = time.monotonic()
        observation = Observation("bare") if args.observed else None
        run_bare_job(spark, batch, bootstrap, observation)
        job_seconds.append(time.monotonic() - t0)
        if observation is not None:
            observed = observation.get
    print("BENCH:" + json.dumps({"job_s": round(sum(job_seconds), 3), "batches": len(job_seconds),
                                 "batch_job_s": [round(s, 3) for s in job_seconds],
                                 "observed": {k: str(v) for k, v in observed.items()},
                                 "python_start": STARTED, "session_ready": ready}),
          flush=True)
    if not remote:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
