"""Staging bulk write paths, inside spark-submit: Spark JDBC with reWriteBatchedInserts (staging.py's
path), plain JDBC batches, and COPY FROM STDIN per partition with psycopg.

spark-submit staging_write.py ROWS REPS   (env MICROBATCH_LEDGER_URL); prints BENCH:{json}.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import psycopg
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from sqlalchemy import make_url

from microbatch.ledger.database import Ledger
from microbatch.phases.stage import jdbc_options

COLUMNS = ("batch_id", "attempt", "window_start", "window_end", "ip", "count", "topic", "partition")


def main(argv: list[str]) -> int:
    rows, reps = int(argv[0]), int(argv[1])
    ledger = os.environ["MICROBATCH_LEDGER_URL"]
    url = make_url(ledger)
    conninfo = {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
                "dbname": url.database}
    spark = SparkSession.builder.appName("bench-staging-write").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    df = spark.range(rows).select(
        F.lit(1).cast("bigint").alias("batch_id"), F.lit(1).alias("attempt"),
        F.timestamp_seconds(F.lit(1_795_000_000) + (F.col("id") % 100) * 5).alias("window_start"),
        F.timestamp_seconds(F.lit(1_795_000_005) + (F.col("id") % 100) * 5).alias("window_end"),
        F.concat(F.lit("10.0."), (F.col("id") / 256 % 256).cast("int"), F.lit("."), F.col("id") % 256).alias("ip"),
        (F.col("id") % 7 + 1).alias("count"), F.lit("bench_src").alias("topic"),
        (F.col("id") % 8).cast("int").alias("partition"),
    ).repartition(2).cache()
    df.count()

    def clear() -> None:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute("TRUNCATE stage_ip_counts")

    def jdbc(rewrite: bool) -> None:
        options = jdbc_options(Ledger(ledger))
        if not rewrite:
            options["url"] = options["url"].replace("?reWriteBatchedInserts=true", "")
        df.write.format("jdbc").options(**options).option("dbtable", "stage_ip_counts").mode("append").save()

    def copy() -> None:
        def write_partition(it) -> None:
            with psycopg.connect(**conninfo) as conn, conn.cursor() as cur, \
                    cur.copy(f"COPY stage_ip_counts ({', '.join(COLUMNS)}) FROM STDIN") as out:
                for row in it:
                    out.write_row(row)

        df.foreachPartition(write_partition)

    def copy_arrow() -> None:
        """COPY fed from Arrow batches (mapInArrow), text format built per batch: no per-row Python calls."""
        import pyarrow as pa

        def write_batches(batches):
            with psycopg.connect(**conninfo) as conn, conn.cursor() as cur, \
                    cur.copy(f"COPY stage_ip_counts ({', '.join(COLUMNS)}) FROM STDIN WITH (FORMAT csv)") as out:
                import pyarrow.csv as pacsv

                n = 0
                for batch in batches:
                    sink = pa.BufferOutputStream()
                    pacsv.write_csv(batch, sink, pacsv.WriteOptions(include_header=False))
                    out.write(sink.getvalue().to_pybytes())
                    n += batch.num_rows
            yield pa.RecordBatch.from_pydict({"n": [n]})

        df.mapInArrow(write_batches, "n long").collect()

    paths = {"jdbc_rewrite_batched (staging.py)": lambda: jdbc(True), "jdbc_plain_batches": lambda: jdbc(False),
             "copy_psycopg_rows": copy, "copy_arrow_csv": copy_arrow}
    seconds: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(reps):
        for name, run in paths.items():
            clear()
            t0 = time.monotonic()
            run()
            seconds[name].append(round(time.monotonic() - t0, 3))
            with psycopg.connect(**conninfo) as conn:
                found = conn.execute("SELECT count(*) FROM stage_ip_counts").fetchone()[0]
            if found != rows:
                raise RuntimeError(f"{name} wrote {found} rows, expected {rows}")
    clear()
    print("BENCH:" + json.dumps({"rows": rows, "seconds": seconds,
                                 "median_s": {k: statistics.median(v) for k, v in seconds.items()}}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
