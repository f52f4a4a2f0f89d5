"""The Delta peer: Structured Streaming, Trigger.AvailableNow, the same JSON click parse as the `clicks` job
(spark_jobs/clicks.py: its `parse`, the valid rows, its `clicks_lake` output), written by Delta's own streaming
sink (`writeStream.format("delta")`, append, its own checkpoint directory; Delta makes each micro-batch one
idempotent commit keyed by the query id and batch id) into a Delta table made like microbatch's.

spark-submit peer_delta.py TOPIC CHECKPOINT_DIR TABLE_PATH MAX_OFFSETS_PER_TRIGGER(0 = unlimited)
env: MICROBATCH_KAFKA_BOOTSTRAP; the session needs Delta's extension (microbatch.sinks.delta.SPARK_SESSION_CONF).
The table must exist (bench/delta_sink.py creates it with delta-rs, as `microbatch migrate` does).
Prints BENCH:{json}.
"""

from __future__ import annotations

import json
import os
import sys
import time

STARTED = time.time()

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from microbatch.config import SOURCE_COORDINATES  # noqa: E402
from spark_jobs.clicks import transform  # noqa: E402

OPTIONS = {"window_seconds": 60, "allowed_lateness_seconds": 5}
COLUMNS = (*SOURCE_COORDINATES, "user", "page", "ts")


def offsets_read(progress: dict) -> int:
    """The offsets one micro-batch read, from its progress's start and end offsets per partition. (Its
    numInputRows stays 0: Delta's sink re-plans the micro-batch's DataFrame, so the source's metrics that
    the progress counts are never filled.)"""
    total = 0
    for source in progress["sources"]:
        start = json.loads(source["startOffset"]) if isinstance(source["startOffset"], str) else source["startOffset"]
        end = json.loads(source["endOffset"]) if isinstance(source["endOffset"], str) else source["endOffset"]
        for topic, partitions in (end or {}).items():
            for partition, offset in partitions.items():
                total += offset - ((start or {}).get(topic, {}).get(partition, 0))
    return total


def main(argv: list[str]) -> int:
    topic, checkpoint, table, max_offsets = argv[0], argv[1], argv[2], int(argv[3])
    spark = SparkSession.builder.appName("bench-peer-delta").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    ready = time.time()
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", os.environ["MICROBATCH_KAFKA_BOOTSTRAP"])
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true").option("kafka.isolation.level", "read_committed"))
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    # No watermark state (as in microbatch's first batch; its append sink takes late clicks anyway): every
    # valid click is one row, a dead letter none.
    parsed = transform.parse(reader.load(), OPTIONS, {})
    rows = transform.outputs(parsed.where(F.col("error").isNull()), OPTIONS, {})["clicks_lake"].select(*COLUMNS)
    t0 = time.monotonic()
    query = (rows.writeStream.format("delta").outputMode("append").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(table))
    query.awaitTermination()
    seconds = time.monotonic() - t0
    read = [offsets_read(json.loads(p.json)) for p in query.recentProgress]
    records, batches = sum(read), sum(1 for n in read if n)
    print("BENCH:" + json.dumps({"records": records, "query_s": round(seconds, 3), "batches": batches,
                                 "python_start": STARTED, "session_ready": ready}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
