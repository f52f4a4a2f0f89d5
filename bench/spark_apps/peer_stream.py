"""The peer: Structured Streaming, Trigger.AvailableNow, the same parse + window aggregation as
ip_count, and foreachBatch writing to the same PostgreSQL: JDBC into a staging table, then one
transaction that merges it into the sink (INSERT ... ON CONFLICT DO UPDATE, like our commit) and
records the batch id (idempotent replays), with its own checkpoint directory.

spark-submit peer_stream.py TOPIC CHECKPOINT_DIR MAX_OFFSETS_PER_TRIGGER(0 = unlimited)
env: MICROBATCH_KAFKA_BOOTSTRAP, MICROBATCH_LEDGER_URL. Prints BENCH:{json}.
With SPARK_REMOTE=sc://... the same query runs as a Spark Connect client of that (warm) server: Structured
Streaming over Spark Connect, its foreachBatch function run by the server's Python worker (d' in
bench/throughput.py), so that it meets microbatch's Connect mode on equal footing.
Tables peer_stage_ip_counts, peer_ip_counts and peer_progress must exist (bench/throughput.py creates them).
"""

from __future__ import annotations

import json
import os
import sys
import time

STARTED = time.time()

import psycopg  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from session import bench_session  # noqa: E402
from sqlalchemy import make_url  # noqa: E402

from microbatch.ledger.database import Ledger  # noqa: E402
from microbatch.phases.stage import jdbc_options  # noqa: E402
from spark_jobs.ip_count import transform  # noqa: E402

OPTIONS = {"window_seconds": 5, "allowed_lateness_seconds": 5}
MERGE = (
    "INSERT INTO peer_ip_counts (window_start, window_end, ip, count) "
    "SELECT window_start, window_end, ip, sum(count) FROM peer_stage_ip_counts WHERE batch_id = %(b)s "
    "GROUP BY window_start, window_end, ip "
    "ON CONFLICT (window_start, window_end, ip) DO UPDATE SET count = peer_ip_counts.count + EXCLUDED.count"
)


def stage_rows(records: DataFrame, batch_id: int, jdbc: dict[str, str]) -> None:
    """The peer's Spark work on one micro-batch: parse, keep the good records, aggregate, and write the rows
    (one per IP, window and source partition) into its staging table over JDBC."""
    good = transform.parse(records, OPTIONS, {}).where(F.col("error").isNull())
    out = transform.outputs(good, OPTIONS, {})["ip_counts"].select(F.lit(batch_id).cast("bigint").alias(
        "batch_id"), "window_start", "window_end", "ip", "count")
    out.write.format("jdbc").options(**jdbc).option("dbtable", "peer_stage_ip_counts").mode("append").save()


def _input_rows(progress: object) -> int:
    """numInputRows of one progress report: a dict in classic PySpark, an object over Spark Connect."""
    value = getattr(progress, "numInputRows", None)
    return int(value if value is not None else progress["numInputRows"])  # type: ignore[index]


def main(argv: list[str]) -> int:
    topic, checkpoint, max_offsets = argv[0], argv[1], int(argv[2])
    ledger = os.environ["MICROBATCH_LEDGER_URL"]
    url = make_url(ledger)
    conninfo = dict(host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database)
    jdbc = jdbc_options(Ledger(ledger))
    spark, remote = bench_session("bench-peer")
    ready = time.time()
    batches: list[dict] = []

    def write(df, batch_id: int) -> None:
        t0 = time.monotonic()
        with psycopg.connect(**conninfo) as conn:
            if conn.execute("SELECT 1 FROM peer_progress WHERE batch_id = %s", (batch_id,)).fetchone():
                return  # a replay of a batch that already committed
        stage_rows(df, batch_id, jdbc)
        t1 = time.monotonic()
        with psycopg.connect(**conninfo) as conn, conn.transaction():
            merged = conn.execute(MERGE, {"b": batch_id}).rowcount
            conn.execute("INSERT INTO peer_progress (batch_id) VALUES (%s)", (batch_id,))
            conn.execute("DELETE FROM peer_stage_ip_counts WHERE batch_id = %s", (batch_id,))
        batches.append({"batch_id": batch_id, "stage_s": round(t1 - t0, 3), "merge_s": round(time.monotonic() - t1, 3),
                        "rows": merged})

    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", os.environ["MICROBATCH_KAFKA_BOOTSTRAP"])
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true").option("kafka.isolation.level", "read_committed"))
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    t0 = time.monotonic()
    query = (reader.load().writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - t0
    records = sum(_input_rows(p) for p in query.recentProgress)
    if remote:  # foreachBatch ran in the server's Python worker: its list stayed there; the table has the batches
        with psycopg.connect(**conninfo) as conn:
            batches = [{"batch_id": b} for (b,) in conn.execute("SELECT batch_id FROM peer_progress ORDER BY 1")]
    print("BENCH:" + json.dumps({"records": records, "query_s": round(seconds, 3), "batches": batches,
                                 "python_start": STARTED, "session_ready": ready}), flush=True)
    if not remote:  # a Connect client leaves the shared server running
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
