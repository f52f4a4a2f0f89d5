"""Goal 2 of issue 22, in one application: the Spark work of the bare job (b2), of microbatch's stage (c) and of the
peer's micro-batch (d) on the same ranges, alternated round after round, each in its own Spark job group.

spark-submit cpu_pairs.py RANGES_JSON ROUNDS [RUNS]   prints BENCH:{json}; RUNS: comma-separated, default b2,c,d
env: MICROBATCH_KAFKA_BOOTSTRAP, MICROBATCH_LEDGER_URL (a migrated ledger holding the peer's staging table) and
MICROBATCH_PIPELINES_DIR (the ip_count spec whose stage c runs).

- b2: `bare_job.run_bare_job`, read, parse, aggregate, Spark's `noop` sink; b2o: the same with the stage's
  observed metrics (`stage.read_metrics`); b2o1: with one observed count only, the cost of Spark's observe node
  itself (it runs outside whole-stage code generation).
- c: the stage's own code on one batch (`phases.stage`): the read through the V2 scan, the job's parse, the observed
  counts, the job's outputs, the sink's staged rows (summed per key with `contributions: per_batch`), the tags, and
  the JDBC write into the sink's staging table with its row count. No ledger row is touched. It observes the
  total read, which on these dense ranges gives the exact count per partition; cp: the same with one counter per
  partition, as a pipeline whose last read had holes (transaction markers) counts; cw: c with a watermark in the
  state that moves on every round, as event time moves a live pipeline's watermark from batch to batch; cw0: c with
  the same watermark every round (cw - cw0 is what a new watermark costs a batch: nothing once Spark reuses its
  generated code, `microbatch.transform.batch_constant`).
- d: `peer_stream.stage_rows`, the peer's foreachBatch body, on a batch read of the same ranges (the streaming
  read and the batch read hand Spark the same Kafka reader; only the query around it differs).

Each round runs them in a rotated order, so that none always runs first after a warm JVM. The executor CPU of
each comes from the event log, by job group (`bench/common.py task_metrics_by_group`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bare_job import run_bare_job
from peer_stream import stage_rows
from pyspark.sql import Observation
from session import bench_session

from microbatch.config import find_spec
from microbatch.ledger.database import Ledger
from microbatch.phases.stage import (
    _Attempt,
    _read_ranges,
    _stage_outputs,
    jdbc_options,
    kafka_read_options,
    keep_observed_metrics,
    load_job,
    with_pooled_consumers,
)
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange

RUNS = ("b2", "c", "d")
WATERMARK_US = 1_700_000_000_000_000  # 2023-11-14, before every record: none is late


def main(argv: list[str]) -> int:
    ranges = [OffsetRange(**r) for r in json.loads(Path(argv[0]).read_text())]
    rounds = int(argv[1])
    runs = tuple(argv[2].split(",")) if len(argv) > 2 else RUNS
    bootstrap, ledger = os.environ["MICROBATCH_KAFKA_BOOTSTRAP"], os.environ["MICROBATCH_LEDGER_URL"]
    spark, _ = bench_session("bench-cpu-pairs")
    spec = find_spec("ip_count")
    job = load_job(spec)
    jdbc = jdbc_options(Ledger(ledger))
    keep_observed_metrics(spark)

    def c(round_no: int, count_partitions: bool = False, state: dict | None = None) -> None:
        attempt = _Attempt(1, round_no + 1, ranges, state or {}, count_partitions)
        parsed = job.parse(_read_ranges(spark, spec, ranges, bootstrap), spec.job_options, attempt.state_before)
        _stage_outputs(spec, job, parsed, attempt, jdbc, ledger)

    def d(round_no: int) -> None:
        options = with_pooled_consumers(kafka_read_options(ranges, KafkaSettings(bootstrap), "read_committed"))
        stage_rows(spark.read.format("kafka").options(**options).load(), round_no, jdbc)

    work = {"b2": lambda _: run_bare_job(spark, ranges, bootstrap), "c": c, "d": d,
            "cp": lambda round_no: c(round_no, count_partitions=True),
            "cw": lambda round_no: c(round_no, state={"watermark_us": WATERMARK_US + round_no * 1_000_000}),
            "cw0": lambda round_no: c(round_no, state={"watermark_us": WATERMARK_US}),
            "b2o": lambda round_no: run_bare_job(spark, ranges, bootstrap, Observation(f"b2o_{round_no}")),
            "b2o1": lambda round_no: run_bare_job(spark, ranges, bootstrap, Observation(f"b2o1_{round_no}"),
                                                  only_count=True)}
    wall: list[dict[str, float]] = []
    for round_no in range(rounds):
        order = runs[round_no % len(runs):] + runs[:round_no % len(runs)]
        seconds = {}
        for name in order:
            spark.sparkContext.setJobGroup(f"{round_no}:{name}", f"round {round_no}, {name}")
            t0 = time.monotonic()
            work[name](round_no)
            seconds[name] = round(time.monotonic() - t0, 3)
        wall.append(seconds)
    print("BENCH:" + json.dumps({"wall": wall, "records": sum(r.size for r in ranges)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
