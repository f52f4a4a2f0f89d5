"""The same windowed aggregation as a SQL pipeline's query (`microbatch/sql_job.py`) and as a Python job written by
hand, in one local Spark session (2 cores), alternating: each round runs both over the same cached batch of decoded
payment records (--records rows, typed columns as `source.value: json` gives them, spread over 8 partitions of one
topic) through the job contract (`parse`: event time and the late flag from the watermark in the state; `outputs`:
the per-partition partial sums per merchant and one-minute window) and writes the result to Spark's `noop` sink.
Medians of --rounds, records per second, and the SQL path's ratio to the Python path.

    PYTHONPATH=include:. .venv/bin/python bench/sql_job.py --rounds 7 --records 2000000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_delta_session, machine, median, print_table, reproduce_command, write_results

from microbatch.config import PipelineSpec

QUERY = ("SELECT window_start(ts) AS window_start, window_end(ts) AS window_end, merchant, "
         "SUM(amount_cents) AS amount_cents, COUNT(*) AS payments FROM records "
         "WHERE status = 'captured' GROUP BY window_start(ts), window_end(ts), merchant")
SPEC = {
    "name": "bench_sql",
    "source": {"topics": ["payments"], "value": {"format": "json", "fields": {
        "payment_id": "string", "merchant": "string", "amount_cents": "bigint", "status": "string",
        "ts": "timestamp"}}},
    "event_time": {"column": "ts", "window": "1m", "allowed_lateness": "5s"},
    "sinks": [{"name": "totals", "type": "postgres_aggregate", "table": "totals",
               "columns": {"window_start": "timestamptz", "window_end": "timestamptz", "merchant": "text",
                           "amount_cents": "bigint", "payments": "bigint"},
               "keys": ["window_start", "window_end", "merchant"], "sum_columns": ["amount_cents", "payments"],
               "window": {"start": "window_start", "end": "window_end"}, "sql": QUERY}],
}


class HandWritten:
    """The Python job a user would write for the same sink: the same event time rule, the aggregation by hand."""

    def parse(self, records: Any, options: Mapping[str, Any], state: Mapping[str, Any]) -> Any:
        from pyspark.sql import functions as F

        from microbatch.event_time import with_late

        checked = records.select("*", F.col("ts").alias("event_time"),
                                 F.when(F.col("ts").isNull(), F.lit("ts is null")).alias("error"))
        return with_late(checked, int(options["window_seconds"]), state)

    def outputs(self, parsed: Any, options: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, Any]:
        from pyspark.sql import functions as F

        width = int(options["window_seconds"])
        start = F.floor(F.unix_seconds("ts") / width) * width
        totals = (parsed.where(F.col("status") == "captured")
                  .groupBy("topic", "partition", F.timestamp_seconds(start).alias("window_start"),
                           F.timestamp_seconds(start + width).alias("window_end"), "merchant")
                  .agg(F.sum("amount_cents").alias("amount_cents"), F.count(F.lit(1)).alias("payments")))
        return {"totals": totals}


def records(spark: Any, count: int) -> Any:
    """A batch of decoded payment records, as the stage gives them to `parse` (record columns, then typed ones)."""
    from pyspark.sql import functions as F

    return spark.range(count).select(
        F.lit(None).cast("binary").alias("key"), F.lit(None).cast("binary").alias("value"),
        F.lit("payments").alias("topic"), (F.col("id") % 8).cast("int").alias("partition"),
        (F.col("id") / 8).cast("bigint").alias("offset"), F.timestamp_seconds(F.lit(1_764_000_000)).alias("timestamp"),
        F.lit(0).alias("timestamp_type"), F.concat(F.lit("p"), F.col("id").cast("string")).alias("payment_id"),
        F.concat(F.lit("m"), (F.col("id") % 50).cast("string")).alias("merchant"),
        (F.col("id") * 7919 % 100_000).alias("amount_cents"),
        F.when(F.col("id") % 10 < 8, F.lit("captured")).otherwise(F.lit("failed")).alias("status"),
        F.timestamp_seconds(F.lit(1_764_000_000) + F.col("id") / 1000).alias("ts"))


def run_once(job: Any, batch: Any, options: Mapping[str, Any], state: Mapping[str, Any]) -> float:
    from pyspark.sql import functions as F

    started = time.monotonic()
    parsed = job.parse(batch, options, state)
    on_time = parsed.where(F.col("error").isNull() & ~F.col("late"))
    job.outputs(on_time, options, state)["totals"].write.format("noop").mode("overwrite").save()
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--records", type=int, default=2_000_000)
    args = parser.parse_args(argv)

    from pyspark import StorageLevel

    from microbatch.sql_job import SqlJob

    spec = PipelineSpec.model_validate(SPEC)
    options, state = spec.job_options, {"watermark_us": 1_764_000_000 * 1_000_000}
    jobs = {"sql": SqlJob(spec), "python": HandWritten()}
    spark = local_delta_session("bench-sql-job")
    batch = records(spark, args.records).persist(StorageLevel.MEMORY_ONLY)
    batch.count()
    for job in jobs.values():  # warm-up: code generation and the JIT
        run_once(job, batch, options, state)
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for round_ in range(args.rounds):
        for name in (list(jobs) if round_ % 2 == 0 else list(reversed(jobs))):
            seconds[name].append(run_once(jobs[name], batch, options, state))
    spark.stop()
    rates = {name: args.records / median(values) for name, values in seconds.items()}
    ratio = median(seconds["sql"]) / median(seconds["python"])
    results = {"machine": machine(), "command": reproduce_command("bench/sql_job.py", argv or sys.argv[1:]),
               "query": QUERY, "ratio_sql_to_python_seconds": ratio,
               **{name: {"median_s": median(v), "records_per_s": rates[name], "raw": v} for name, v in seconds.items()}}
    print_table(f"one windowed aggregation over {args.records:,} records (medians of {args.rounds}, alternating)",
                ["job", "seconds", "records/s"],
                [[name, median(seconds[name]), f"{rates[name]:,.0f}"] for name in jobs])
    print(f"SQL / Python seconds: {ratio:.3f}")
    print(f"results: {write_results('sql_job', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
