"""The `iceberg` sink (issue 48): microbatch writing an Apache Iceberg table against Spark Structured Streaming
writing the same table through pyiceberg, and against microbatch's `delta` sink, in one run on one local stack
(Kafka, PostgreSQL), alternating, --reps rounds.

The data: --records payment events as JSON objects (`{"payment_id", "merchant", "amount_cents", "status", "ts"}`,
~125 bytes, every one valid), produced round-robin over --partitions partitions with confluent-kafka's Producer
(fast; not part of any timing).

Each round runs three legs, each writing every record as one row (the five fields, and the record's topic,
partition and offset) into a new, unpartitioned table:

- `microbatch_iceberg`: a SQL pipeline (`source.value: {format: json, fields: ...}`, one `iceberg` sink,
  `sql: SELECT ... FROM records`), one batch of all the records, as bench/avro.py's microbatch leg runs it: plan
  (bench/phase.py), stage (spark-submit spark_jobs/run_batch.py through bench/spark_apps/stage_entry.py: Spark's
  executors write the Parquet files, ONE pyiceberg `add_files` commit adds them, the snapshot recorded in the
  ledger), commit (bench/phase.py), on a fresh ledger whose PostgreSQL database holds the SQL catalog (the table
  created by `migrate_sinks`, as `microbatch migrate` does, untimed);
- `peer_iceberg`: Structured Streaming, `Trigger.AvailableNow`, one micro-batch, its own checkpoint; `foreachBatch`
  decodes with `from_json`, collects the micro-batch to the driver with `toArrow()` and appends it with pyiceberg's
  `Table.append` to a table of its own in a pyiceberg SqlCatalog (its own PostgreSQL database; the table created
  before the run, untimed), skipping a micro-batch whose id a snapshot summary already names (what a user writes
  so that a replayed micro-batch is not appended twice);
- `microbatch_delta`: the `microbatch_iceberg` pipeline with a `delta` sink (`type: delta`, append) instead, on
  the same records (the table created by delta-rs in `migrate_sinks`, untimed).

After each leg its table is read back, by pyiceberg's own scan (not the project's code) or by delta-rs: one row per
record (each (partition, offset) once), every field decoded, the sum of `amount_cents` as produced.

"wall" is, for the peer, its spark-submit from launch to exit (JVM and Spark start included); for microbatch, as
bench/throughput.py's microbatch leg counts it: the plan and the commit timed inside their processes (as in a worker
that imported them already), plus the stage's spark-submit from launch to exit; `processes_s` adds the plan's and
the commit's Python start. "engine" is the time inside the started application (microbatch: the stage's read, which
includes the table write, and its staging write as the ledger records them, plus the commit; the peer: the query).
Ratios are records/s of microbatch's iceberg sink over the other leg (below 1: it is slower), of the medians, and
the median of each round's own ratio.

    PYTHONPATH=include:. .venv/bin/python bench/iceberg.py --records 1000000 --reps 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    Stack,
    end_offsets,
    local_stack,
    machine,
    median,
    print_table,
    reproduce_command,
    run_microbatch,
    spark_submit,
    write_results,
)

log = logging.getLogger(__name__)

TOPIC = "bench_iceberg"
PIPELINE = "bench_iceberg"
SINK = "payments"
NAMESPACE = "bench"
T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)
FIELDS = {"payment_id": "string", "merchant": "string", "amount_cents": "bigint", "status": "string",
          "ts": "timestamp"}
COLUMNS = {"payment_id": "text", "merchant": "text", "amount_cents": "bigint", "status": "text", "ts": "timestamptz"}
MERCHANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
STATUSES = ("captured", "refunded", "authorized", "pending")
LEGS = ("microbatch_iceberg", "peer_iceberg", "microbatch_delta")
RATIOS = (("microbatch iceberg / peer iceberg", "microbatch_iceberg", "peer_iceberg"),
          ("microbatch iceberg / microbatch delta", "microbatch_iceberg", "microbatch_delta"))
PEER_CATALOG_ENV = "BENCH_PEER_CATALOG_URI"
PEER_WAREHOUSE_ENV = "BENCH_PEER_WAREHOUSE"
PEER_BATCH_KEY = "peer.batch_id"
"""The peer's snapshot summary property naming the micro-batch it holds."""


def amount(i: int) -> int:
    return (i * 7919) % 250_000


# ---------------------------------------------------------------- data


def fill(bootstrap: str, records: int, partitions: int) -> dict[str, Any]:
    """`records` JSON payments, round-robin over the partitions; production figures."""
    from confluent_kafka import Producer

    from microbatch.dev.kafka import create_topic

    create_topic(bootstrap, TOPIC, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 50, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1 << 21,
                         "compression.type": "none"})
    started = time.monotonic()
    size = 0
    for i in range(records):
        value = json.dumps({
            "payment_id": f"pay-{i:012d}", "merchant": MERCHANTS[i % 6], "amount_cents": amount(i),
            "status": STATUSES[i % 4],
            "ts": (T0 + timedelta(milliseconds=37 * i)).isoformat(timespec="milliseconds")}).encode()
        size += len(value)
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} records were not delivered")
    seconds = time.monotonic() - started
    ends = end_offsets(bootstrap, TOPIC)
    if sum(ends.values()) != records:
        raise RuntimeError(f"the topic holds {sum(ends.values())} records, expected {records}")
    return {"records": records, "seconds": round(seconds, 2), "mean_value_bytes": round(size / records, 1),
            "partition_ends": ends}


# ---------------------------------------------------------------- the peer: `iceberg.py app peer CHECKPOINT`


def app(argv: list[str]) -> int:
    """spark-submit iceberg.py app peer CHECKPOINT; env MICROBATCH_KAFKA_BOOTSTRAP, the peer's catalog in
    BENCH_PEER_CATALOG_URI and BENCH_PEER_WAREHOUSE. Prints BENCH:{json}."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    if argv[0] != "peer":
        raise SystemExit(f"unknown app {argv[0]}")
    checkpoint = argv[1]
    catalog = SqlCatalog("peer", uri=os.environ[PEER_CATALOG_ENV], warehouse=os.environ[PEER_WAREHOUSE_ENV])
    schema = ", ".join(f"{name} {kind}" for name, kind in FIELDS.items())
    spark = SparkSession.builder.appName("bench-iceberg-peer").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    batches: list[dict[str, Any]] = []

    def write(records: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        table = catalog.load_table((NAMESPACE, SINK))
        if any((s.summary or {}).get(PEER_BATCH_KEY) == str(batch_id) for s in table.snapshots()):
            batches.append({"batch_id": batch_id, "skipped": True})
            return
        rows = (records.select(F.from_json(F.col("value").cast("string"), schema).alias("v"), "topic", "partition",
                               "offset")
                .select("topic", "partition", "offset", *(F.col(f"v.{name}").alias(name) for name in FIELDS)))
        data = rows.toArrow()
        t1 = time.monotonic()
        table.append(data, snapshot_properties={PEER_BATCH_KEY: str(batch_id)})
        t2 = time.monotonic()
        batches.append({"batch_id": batch_id, "rows": data.num_rows, "collect_s": round(t1 - t0, 3),
                        "append_s": round(t2 - t1, 3)})

    started = time.monotonic()
    bootstrap = os.environ["MICROBATCH_KAFKA_BOOTSTRAP"]
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", TOPIC).option("startingOffsets", "earliest").option("failOnDataLoss", "true")
             .load().writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    read = sum(int(p["numInputRows"]) for p in query.recentProgress)
    seconds = time.monotonic() - started
    spark.stop()
    print("BENCH:" + json.dumps({"engine_s": round(seconds, 3), "records": read, "batches": batches}), flush=True)
    return 0


# ---------------------------------------------------------------- the tables, read back


def iceberg_schema() -> Any:
    """The peer's table: the columns of microbatch's iceberg table (the source coordinates, then the fields)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType, TimestamptzType

    types = {"topic": StringType(), "partition": IntegerType(), "offset": LongType(), "payment_id": StringType(),
             "merchant": StringType(), "amount_cents": LongType(), "status": StringType(), "ts": TimestamptzType()}
    return Schema(*[NestedField(field_id=i + 1, name=name, field_type=type_, required=False)
                    for i, (name, type_) in enumerate(types.items())])


def sql_catalog(name: str, url: str, warehouse: Path) -> Any:
    """pyiceberg's SQL catalog `name` in the database `url` (its tables created if missing)."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(name, uri=url, warehouse=warehouse.as_uri())


def checked(data: Any, records: int, leg: str, commits: int) -> dict[str, Any]:
    """The table (Arrow) holds one row per record, each (partition, offset) once, every field decoded, the amounts
    as produced."""
    import pyarrow.compute as pc

    distinct = data.select(["partition", "offset"]).group_by(["partition", "offset"]).aggregate([]).num_rows
    nulls = sum(data.column(name).null_count for name in FIELDS)
    total = pc.sum(data.column("amount_cents")).as_py() or 0
    expected = sum(amount(i) for i in range(records))
    if data.num_rows != records or distinct != records or nulls or total != expected:
        raise RuntimeError(f"{leg}: {data.num_rows} rows ({distinct} distinct coordinates, {nulls} null fields, "
                           f"amounts {total}), expected {records} (amounts {expected})")
    return {"rows": data.num_rows, "commits": commits}


def checked_iceberg(catalog_name: str, url: str, warehouse: Path, records: int, leg: str) -> dict[str, Any]:
    """The Iceberg table read back by pyiceberg's scan: `checked`, in one snapshot."""
    table = sql_catalog(catalog_name, url, warehouse).load_table((NAMESPACE, SINK))
    snapshots = len(table.snapshots())
    if snapshots != 1:
        raise RuntimeError(f"{leg}: {snapshots} snapshots, expected 1")
    out = checked(table.scan().to_arrow(), records, leg, snapshots)
    out["files"] = len(table.inspect.files())
    return out


def checked_delta(path: Path, records: int, leg: str) -> dict[str, Any]:
    """The Delta table read back by delta-rs: `checked`, in one version after the table's creation."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    if table.version() != 1:
        raise RuntimeError(f"{leg}: the Delta table is at version {table.version()}, expected 1")
    out = checked(table.to_pyarrow_table(columns=["partition", "offset", *FIELDS]), records, leg, 1)
    out["files"] = len(table.file_uris())
    return out


# ---------------------------------------------------------------- the legs


def write_spec(directory: Path, records: int, sink: dict[str, Any]) -> Path:
    import yaml

    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [TOPIC], "max_records_per_batch": records, "commit_group_offsets": False,
                   "value": {"format": "json", "fields": FIELDS}},
        "sinks": [{**sink, "name": SINK, "columns": COLUMNS, "sql": f"SELECT {', '.join(COLUMNS)} FROM records"}],
        "spark": {"mode": "submit", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return directory


def microbatch_leg(stack: Stack, name: str, records: int, kind: str, driver_memory: str) -> dict[str, Any]:
    """`run_microbatch` of the spec over all the records (one batch), on a fresh ledger and a new table of the sink
    type `kind` (iceberg or delta)."""
    from microbatch.sinks.delta import WAREHOUSE_ENV

    warehouse = stack.work_dir / "warehouse"
    path = warehouse / name
    sink = {"type": kind, "path": str(path), "mode": "append"}
    if kind == "iceberg":
        sink["namespace"] = NAMESPACE
    spec_dir = write_spec(stack.work_dir / "specs" / name, records, sink)
    url, out = run_microbatch(stack, name, PIPELINE, spec_dir, {WAREHOUSE_ENV: str(warehouse)}, driver_memory)
    rows = out["rows_by_sink"].get(SINK, 0)
    if out["dead_letters"] or rows != records or out["lake_commits"] != out["batches"]:
        raise RuntimeError(f"{name}: {out['dead_letters']} dead letters, {rows} rows committed in "
                           f"{out['lake_commits']} recorded table commits, expected {records} in {out['batches']}")
    check = (checked_iceberg("microbatch", url, warehouse, records, name) if kind == "iceberg"
             else checked_delta(path, records, name))
    return {**out, "read_and_table_write_s": out["read_s"], "check": check}


def peer_leg(stack: Stack, name: str, records: int, driver_memory: str) -> dict[str, Any]:
    """Structured Streaming into a new Iceberg table of its own catalog (a fresh database), as its own
    spark-submit."""
    stack.postgres.create_database(name)
    url = stack.postgres.url(name)
    warehouse = stack.work_dir / "warehouse-peer" / name
    warehouse.mkdir(parents=True)
    catalog = sql_catalog("peer", url, warehouse)
    catalog.create_namespace_if_not_exists(NAMESPACE)
    catalog.create_table((NAMESPACE, SINK), schema=iceberg_schema())
    result = spark_submit(Path(__file__).resolve(), ["app", "peer", str(stack.work_dir / "checkpoints" / name)],
                          {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap, PEER_CATALOG_ENV: url,
                           PEER_WAREHOUSE_ENV: warehouse.as_uri()},
                          conf={"spark.sql.shuffle.partitions": "4"}, driver_memory=driver_memory)
    info = result.json_lines()[-1]
    written = [b for b in info["batches"] if not b.get("skipped")]
    if info["records"] != records or len(written) != 1:
        raise RuntimeError(f"{name}: the peer read {info['records']} records in {len(written)} batches")
    return {"wall_s": round(result.seconds, 3), "engine_s": info["engine_s"], "batches": len(written),
            "collect_s": written[0]["collect_s"], "append_s": written[0]["append_s"],
            "peak_rss_mb": result.peak_rss_mb, "check": checked_iceberg("peer", url, warehouse, records, name)}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "app":
        return app(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="1g", help="spark-submit --driver-memory (Spark's default: 1g)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    log.setLevel(logging.INFO)
    n = args.records
    results: dict[str, Any] = {"machine": machine(), "args": vars(args),
                               "command": reproduce_command("iceberg.py", argv), "runs": {leg: [] for leg in LEGS}}
    runs = results["runs"]
    from microbatch.sinks.delta import WAREHOUSE_ENV

    with local_stack("mb-bench-iceberg-") as stack:
        # migrate_sinks (in this process) opens the catalog with the warehouse the stage is given.
        os.environ[WAREHOUSE_ENV] = str(stack.work_dir / "warehouse")
        results["produce"] = fill(stack.bootstrap, n, args.partitions)
        log.info("produced %s records (%s bytes each on average) in %ss", n, results["produce"]["mean_value_bytes"],
                 results["produce"]["seconds"])
        measure = {
            "microbatch_iceberg": lambda r: microbatch_leg(stack, f"mbi_{r}", n, "iceberg", args.driver_memory),
            "peer_iceberg": lambda r: peer_leg(stack, f"peer_{r}", n, args.driver_memory),
            "microbatch_delta": lambda r: microbatch_leg(stack, f"mbd_{r}", n, "delta", args.driver_memory),
        }
        for rep in range(args.reps):
            for leg in LEGS[rep % len(LEGS):] + LEGS[:rep % len(LEGS)]:
                runs[leg].append({**measure[leg](rep), "round": rep, "load_avg_after": os.getloadavg()})
                log.info("round %s/%s: %s %ss wall, %ss engine (load %.1f)", rep + 1, args.reps, leg,
                         runs[leg][-1]["wall_s"], runs[leg][-1]["engine_s"], os.getloadavg()[0])
            write_results(f"iceberg-{n}-partial", results)  # a long run that dies later keeps its finished rounds

    summary = {leg: {"wall_s": median([r["wall_s"] for r in runs[leg]]),
                     "engine_s": median([r["engine_s"] for r in runs[leg]])} for leg in LEGS}
    for values in summary.values():
        values["wall_rate"] = round(n / values["wall_s"])
        values["engine_rate"] = round(n / values["engine_s"])
    ratios = {label: {kind: round(summary[other][f"{kind}_s"] / summary[mine][f"{kind}_s"], 3)
                      for kind in ("wall", "engine")}
              | {"wall_each_round": [round(o["wall_s"] / m["wall_s"], 3)
                                     for m, o in zip(runs[mine], runs[other], strict=True)]}
              for label, mine, other in RATIOS}
    for values in ratios.values():
        values["wall_median_of_rounds"] = median(values["wall_each_round"])
    phases = {leg: {key: median([r[key] for r in runs[leg]])
                    for key in ("plan_s", "stage_wall_s", "read_and_table_write_s", "commit_s", "processes_s")}
              for leg in ("microbatch_iceberg", "microbatch_delta")}
    phases["peer_iceberg"] = {key: median([r[key] for r in runs["peer_iceberg"]]) for key in ("collect_s", "append_s")}
    results["summary"], results["ratios"], results["phases"] = summary, ratios, phases
    results["load_avg_at_end"] = os.getloadavg()
    print_table(f"{n:,} JSON records ({results['produce']['mean_value_bytes']} bytes each) over {args.partitions} "
                f"partitions into a new table, medians of {args.reps} rounds (alternating)",
                ["leg", "wall s", "wall rec/s", "engine s", "engine rec/s"],
                [[leg, s["wall_s"], s["wall_rate"], s["engine_s"], s["engine_rate"]] for leg, s in summary.items()])
    print_table("Ratios (records/s of the first over the second)", ["ratio", "wall", "engine", "wall, each round"],
                [[k, v["wall"], v["engine"], str(v["wall_each_round"])] for k, v in ratios.items()])
    print_table("Phases (medians, s)", ["leg", "phases"], [[leg, json.dumps(p)] for leg, p in phases.items()])
    print(f"results: {write_results(f'iceberg-{n}', results)}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
