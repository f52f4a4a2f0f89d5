"""Avro through a schema registry (issue 47): microbatch against Spark Structured Streaming doing the same work, and
the bare job, in one run on one local stack (Kafka, PostgreSQL, Apicurio Registry), alternating, --reps rounds.

The data: --records payment events in the Confluent wire format (magic byte 0, the writer schema's registry id,
the Avro binary encoding; ~100 bytes), two schema versions interleaved (v2 adds `currency` with a default), both
registered in the registry under `<topic>-value`, over --partitions partitions. They are serialized here with
fastavro's `schemaless_writer` and the 5-byte header, using the ids the registry returned, and produced with
confluent-kafka's Producer (fast; not part of any timing).

Each round runs four legs, each writing every record as one row (the seven fields, and the record's topic,
partition and offset, primary key) into a PostgreSQL table of a fresh database:

- `microbatch`: a SQL pipeline (`source.value: {format: avro, fields: ...}`, one `postgres_append` sink,
  `sql: SELECT ... FROM records`), one batch of all the records, as bench/throughput.py's microbatch leg runs it: plan
  (bench/phase.py), stage (spark-submit spark_jobs/run_batch.py), commit (bench/phase.py), on a fresh ledger;
- `peer`: Structured Streaming, `Trigger.AvailableNow`, one micro-batch; `foreachBatch` decodes as the platform
  does (the header's id chooses the writer schema, `from_avro(payload, writer, {avroSchema: v2, mode:
  PERMISSIVE})`) and appends the rows over JDBC (the stage's JDBC options); its own checkpoint;
- `bare`: a batch `spark.read` of the topic's offset range, the same decode and the same JDBC append: no ledger,
  no streaming engine (what exactly-once costs is microbatch over it);
- `microbatch_json`: microbatch on the same records as JSON objects (another topic, `value: {format: json,
  fields: ...}`), the rest as `microbatch`: what Avro through a registry costs against the platform's JSON.

"wall" is, for the peer and the bare job, their spark-submit from launch to exit (JVM and Spark start included); for
microbatch, as bench/throughput.py's microbatch leg counts it: the plan and the commit timed inside their processes
(as in a worker that imported them already), plus the stage's spark-submit from launch to exit; `processes_s` adds
the plan's and the commit's Python start. "engine" is the time inside the started application (microbatch: the
stage's read and staging write as the ledger records them, plus the commit; the peer: the query; the bare job: read
+ decode + write). Ratios are records/s of microbatch over the other (below 1: microbatch is slower), of the
medians, and the median of each round's own ratio.

    PYTHONPATH=include:. .venv/bin/python bench/avro.py --records 1000000 --reps 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import struct
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

TOPIC = "bench_avro"
PIPELINE = "bench_avro"
TABLE = "payments"
T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)
V1 = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "payment_id", "type": "string"}, {"name": "merchant", "type": "string"},
    {"name": "amount_cents", "type": "long"}, {"name": "status", "type": ["null", "string"], "default": None},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": "string"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
FIELDS = {"payment_id": "string", "merchant": "string", "amount_cents": "bigint", "status": "string",
          "ts": "timestamp", "note": "string", "currency": "string"}
COLUMNS = {"payment_id": "text", "merchant": "text", "amount_cents": "bigint", "status": "text", "ts": "timestamptz",
           "note": "text", "currency": "text"}
LEGS = ("microbatch", "peer", "bare", "microbatch_json")
RATIOS = (("microbatch/peer", "microbatch", "peer"), ("microbatch/bare", "microbatch", "bare"),
          ("peer/bare", "peer", "bare"), ("microbatch avro/json", "microbatch", "microbatch_json"))
JSON_TOPIC = "bench_avro_json"


# ---------------------------------------------------------------- data


def register(url: str, subject: str) -> dict[str, int]:
    """V1 then V2 under `subject`: the ids the registry gave them."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    return {name: client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
            for name, schema in (("v1", V1), ("v2", V2))}


def fill(bootstrap: str, ids: dict[str, int], records: int, partitions: int, as_json: bool = False) -> dict[str, Any]:
    """`records` values, v1 and v2 alternating, round-robin over the partitions; production figures. `as_json`: the
    same records as JSON objects (v1's with v2's default currency, as the Avro reader gives them) into
    `JSON_TOPIC`, for microbatch's `json` format."""
    import fastavro
    from confluent_kafka import Producer

    from microbatch.dev.kafka import create_topic

    topic = JSON_TOPIC if as_json else TOPIC
    create_topic(bootstrap, topic, partitions)
    parsed = {"v1": fastavro.parse_schema(V1), "v2": fastavro.parse_schema(V2)}
    headers = {name: b"\x00" + struct.pack(">I", schema_id) for name, schema_id in ids.items()}
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 50, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1 << 21,
                         "compression.type": "none"})
    statuses = (None, "captured", "refunded", "authorized")
    merchants = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
    started = time.monotonic()
    size = 0
    for i in range(records):
        version = "v1" if i % 2 == 0 else "v2"
        body = {"payment_id": f"pay-{i:012d}", "merchant": merchants[i % 6], "amount_cents": (i * 7919) % 250_000,
                "status": statuses[i % 4], "ts": T0 + timedelta(milliseconds=37 * i),
                "note": f"order {i % 100_000:05d} via web checkout, basket {i % 977}", "currency": "USD"}
        if as_json:
            value = json.dumps({**body, "ts": body["ts"].isoformat(),
                                "currency": "USD" if version == "v2" else "EUR"}).encode()
        else:
            out = io.BytesIO()
            out.write(headers[version])
            fastavro.schemaless_writer(out, parsed[version], body)
            value = out.getvalue()
        size += len(value)
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} records were not delivered")
    seconds = time.monotonic() - started
    ends = end_offsets(bootstrap, topic)
    if sum(ends.values()) != records:
        raise RuntimeError(f"the topic holds {sum(ends.values())} records, expected {records}")
    return {"records": records, "seconds": round(seconds, 2), "mean_value_bytes": round(size / records, 1),
            "partition_ends": ends}


# ---------------------------------------------------------------- the Spark apps (peer, bare): `avro.py app ...`


def decode(records: Any, writers: dict[int, str]) -> Any:
    """The records' rows: the header's id chooses the writer schema, from_avro resolves it into V2 (what the
    platform's avro format does for all-good records), with the source coordinates."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    writer_id = F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("bigint")
    payload = F.substring("value", 6, 1 << 30)
    options = {"avroSchema": json.dumps(V2), "mode": "PERMISSIVE"}
    decoded: Any = None
    for schema_id, text in sorted(writers.items()):
        branch = from_avro(payload, text, options)
        decoded = F.when(writer_id == schema_id, branch) if decoded is None \
            else decoded.when(writer_id == schema_id, branch)
    row = records.select(decoded.alias("r"), "topic", "partition", "offset")
    return row.select(*(F.col(f"r.{name}").alias(name) for name in COLUMNS), "topic", "partition", "offset")


def app(argv: list[str]) -> int:
    """spark-submit avro.py app peer|bare WRITERS_JSON [CHECKPOINT]; env MICROBATCH_KAFKA_BOOTSTRAP, the target
    database in MICROBATCH_LEDGER_URL. Prints BENCH:{json}."""
    from pyspark.sql import SparkSession

    from microbatch.ledger.database import Ledger
    from microbatch.phases.stage import jdbc_options

    leg, writers = argv[0], {int(k): v for k, v in json.loads(argv[1]).items()}
    bootstrap = os.environ["MICROBATCH_KAFKA_BOOTSTRAP"]
    jdbc = {**jdbc_options(Ledger(os.environ["MICROBATCH_LEDGER_URL"])), "dbtable": TABLE}
    spark = SparkSession.builder.appName(f"bench-avro-{leg}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    batches: list[dict[str, Any]] = []

    def write(records: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        decode(records, writers).write.format("jdbc").options(**jdbc).mode("append").save()
        batches.append({"batch_id": batch_id, "s": round(time.monotonic() - t0, 3)})

    started = time.monotonic()
    if leg == "peer":
        query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", TOPIC).option("startingOffsets", "earliest").option("failOnDataLoss", "true")
                 .load().writeStream.foreachBatch(write).option("checkpointLocation", argv[2])
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        read = sum(int(p["numInputRows"]) for p in query.recentProgress)
    else:
        records = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                   .option("subscribe", TOPIC).option("startingOffsets", "earliest")
                   .option("endingOffsets", "latest").load())
        write(records, 0)
        read = -1
    seconds = time.monotonic() - started
    spark.stop()
    print("BENCH:" + json.dumps({"engine_s": round(seconds, 3), "records": read, "batches": batches}), flush=True)
    return 0


# ---------------------------------------------------------------- the legs


def target_table(url: str) -> None:
    """The peer's or the bare job's table: the sink's columns and the source coordinates (its primary key), as
    `microbatch migrate` creates the postgres_append sink's."""
    from sqlalchemy import text

    from microbatch.ledger.database import transaction

    columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
    with transaction(url) as session:
        session.execute(text(f'CREATE TABLE {TABLE} ({columns}, topic text NOT NULL, "partition" integer NOT NULL, '
                             f'"offset" bigint NOT NULL, PRIMARY KEY (topic, "partition", "offset"))'))


def checked(url: str, records: int, leg: str) -> dict[str, int]:
    """The table holds one row per record, every field decoded (v1's currency from v2's default)."""
    from sqlalchemy import text

    from microbatch.ledger.database import transaction

    with transaction(url) as session:
        rows, eur, nulls = session.execute(text(
            f"SELECT count(*), count(*) FILTER (WHERE currency = 'EUR'), count(*) FILTER (WHERE payment_id IS NULL "
            f"OR ts IS NULL OR note IS NULL OR currency IS NULL) FROM {TABLE}")).one()
    if rows != records or nulls or eur != (records + 1) // 2:
        raise RuntimeError(f"{leg}: {rows} rows ({eur} with the default currency, {nulls} not decoded), expected "
                           f"{records} ({(records + 1) // 2})")
    return {"rows": rows, "default_currency": eur}


def write_spec(directory: Path, records: int, as_json: bool = False) -> Path:
    import yaml

    query = f"SELECT {', '.join(COLUMNS)} FROM records"
    value = {"format": "json", "fields": FIELDS} if as_json else {"format": "avro", "fields": FIELDS}
    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [JSON_TOPIC if as_json else TOPIC], "max_records_per_batch": records,
                   "commit_group_offsets": False, "value": value},
        "sinks": [{"name": TABLE, "type": "postgres_append", "table": TABLE, "columns": COLUMNS, "sql": query}],
        "spark": {"mode": "submit", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def microbatch_leg(stack: Stack, name: str, records: int, registry: str, driver_memory: str,
                   as_json: bool = False) -> dict[str, Any]:
    """`run_microbatch` of the spec over all the records, on a fresh ledger; `as_json`: the same records as JSON,
    through the `json` format."""
    spec_dir = write_spec(stack.work_dir / "specs" / name, records, as_json)
    url, out = run_microbatch(stack, name, PIPELINE, spec_dir, {"MICROBATCH_SCHEMA_REGISTRY_URL": registry},
                              driver_memory)
    if out.pop("dead_letters"):
        raise RuntimeError(f"{name}: dead letters")
    return {**out, "check": checked(url, records, name)}


def spark_leg(stack: Stack, leg: str, name: str, records: int, writers: dict[int, str],
              driver_memory: str) -> dict[str, Any]:
    """The peer or the bare job as its own spark-submit, into a fresh database."""
    stack.postgres.create_database(name)
    url = stack.postgres.url(name)
    target_table(url)
    extra = [str(stack.work_dir / "checkpoints" / name)] if leg == "peer" else []
    result = spark_submit(Path(__file__).resolve(), ["app", leg, json.dumps(writers), *extra],
                          {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap, "MICROBATCH_LEDGER_URL": url},
                          conf={"spark.sql.shuffle.partitions": "4"}, driver_memory=driver_memory)
    info = result.json_lines()[-1]
    if leg == "peer" and (info["records"] != records or len(info["batches"]) != 1):
        raise RuntimeError(f"{name}: the peer read {info['records']} records in {len(info['batches'])} batches")
    return {"wall_s": round(result.seconds, 3), "engine_s": info["engine_s"], "batches": len(info["batches"]),
            "peak_rss_mb": result.peak_rss_mb, "check": checked(url, records, name)}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "app":
        return app(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="1g", help="spark-submit --driver-memory (Spark's default: 1g)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    log.setLevel(logging.INFO)
    n = args.records
    results: dict[str, Any] = {"machine": machine(), "args": vars(args),
                               "command": reproduce_command("avro.py", argv), "runs": {leg: [] for leg in LEGS}}
    runs = results["runs"]
    from microbatch.dev.registry import SchemaRegistry

    with local_stack("mb-bench-avro-") as stack, contextlib.ExitStack() as services:
        registry = services.enter_context(SchemaRegistry(stack.work_dir / "registry"))
        ids = register(registry.url, f"{TOPIC}-value")
        writers = {ids["v1"]: json.dumps(V1), ids["v2"]: json.dumps(V2)}
        results["schema_ids"] = ids
        results["produce"] = fill(stack.bootstrap, ids, n, args.partitions)
        results["produce_json"] = fill(stack.bootstrap, ids, n, args.partitions, as_json=True)
        log.info("produced %s records (%s bytes each on average) in %ss", n, results["produce"]["mean_value_bytes"],
                 results["produce"]["seconds"])
        measure = {
            "microbatch": lambda r: microbatch_leg(stack, f"mb_{r}", n, registry.url, args.driver_memory),
            "peer": lambda r: spark_leg(stack, "peer", f"peer_{r}", n, writers, args.driver_memory),
            "bare": lambda r: spark_leg(stack, "bare", f"bare_{r}", n, writers, args.driver_memory),
            "microbatch_json": lambda r: microbatch_leg(stack, f"mbj_{r}", n, registry.url, args.driver_memory,
                                                        as_json=True),
        }
        for rep in range(args.reps):
            for leg in LEGS[rep % len(LEGS):] + LEGS[:rep % len(LEGS)]:
                runs[leg].append(measure[leg](rep))
                log.info("round %s/%s: %s %ss wall, %ss engine", rep + 1, args.reps, leg, runs[leg][-1]["wall_s"],
                         runs[leg][-1]["engine_s"])

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
    results["summary"], results["ratios"] = summary, ratios
    print_table(f"{n:,} Avro records (2 writer schemas, {results['produce']['mean_value_bytes']} bytes each) over "
                f"{args.partitions} partitions into PostgreSQL, medians of {args.reps} rounds (alternating)",
                ["leg", "wall s", "wall rec/s", "engine s", "engine rec/s"],
                [[leg, s["wall_s"], s["wall_rate"], s["engine_s"], s["engine_rate"]] for leg, s in summary.items()])
    print_table("Ratios (records/s of the first over the second)", ["ratio", "wall", "engine", "wall, each round"],
                [[k, v["wall"], v["engine"], str(v["wall_each_round"])] for k, v in ratios.items()])
    print(f"results: {write_results(f'avro-{n}', results)}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
