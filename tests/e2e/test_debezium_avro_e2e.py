"""Debezium's Avro change events end to end (issue 65), on real Kafka, Postgres, Spark (the suite's Connect server),
Airflow (`dag.test()` through `microbatch run`) and Apicurio Registry (a registry of the test's own, which it stops):
a random history of creates, updates and deletes over a few keys, each a Debezium-shaped envelope and key written by
confluent-kafka's `AvroSerializer` in two envelope versions (the second after a column was added), tombstones after
deletes and a few hazards (another magic byte, a truncate), read with `format: debezium, converter: avro` on both
sides into a `postgres_upsert` replica ordered by `__lsn`. The oracle is the history applied in Python, in log order;
the batches pin the envelope's subject, and the dead letters are the hazards."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaProducer
from sqlalchemy import text

from microbatch.ledger.database import transaction
from tests.e2e.helpers import cli, pipeline_dag_folder, spark_section
from tests.integration.test_debezium_avro_decode import ENVELOPE, ENVELOPE2, KEY, event

pytestmark = pytest.mark.e2e

PIPELINE = "orders_avro_cdc"
T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


@pytest.fixture
def registry(tmp_path: Path):
    from microbatch.dev.registry import SchemaRegistry

    running = SchemaRegistry(tmp_path / "registry").start()
    yield running
    running.stop()


def image(rng: random.Random, key: int, version: int) -> dict[str, Any]:
    placed = T0 + timedelta(seconds=rng.randrange(86_400), microseconds=rng.randrange(1_000_000))
    row = {"id": key, "customer": rng.choice([None, "ada", "grace", "édith"]),
           "amount": Decimal(rng.randrange(-10**9, 10**9)) / 100,
           "placed_at": placed.isoformat().replace("+00:00", "Z"),
           "created": rng.randrange(1_700_000_000_000_000, 1_800_000_000_000_000),
           "day": rng.choice([None, rng.randrange(-1000, 30_000)]), "code": None}
    return {**row, "note": rng.choice([None, "gift"])} if version == 2 else row


def history(rng: random.Random, count: int) -> list[tuple[int, dict[str, Any] | None, int, str | None]]:
    """(key, envelope or None for a tombstone, the envelope's version, the words of its reason when bad): the first
    half in version 1, the rest in version 2."""
    live: dict[int, dict[str, Any]] = {}
    out: list[tuple[int, dict[str, Any] | None, int, str | None]] = []
    for lsn in range(1000, 1000 + count):
        version = 1 if lsn < 1000 + count // 2 else 2
        key = rng.randrange(12)
        roll = rng.random()
        if roll < 0.03:
            out.append((key, event("t", None, None, lsn, lsn), version, "truncate"))
            continue
        if key not in live:
            after = image(rng, key, version)
            out.append((key, event("r" if lsn < 1010 else "c", None, after, lsn, lsn * 7), version, None))
            live[key] = after
        elif roll < 0.25:
            before = live.pop(key)
            out.append((key, event("d", {**before, "note": None} if version == 2 else before, None, lsn, lsn * 7),
                        version, None))
            if rng.random() < 0.7:
                out.append((key, None, version, None))
        else:
            before = {**live[key], "note": live[key].get("note")} if version == 2 else live[key]
            after = {**image(rng, key, version), "id": key}
            out.append((key, event("u", before, after, lsn, lsn * 7), version, None))
            live[key] = after
    return out


def expected(changes: list[tuple[int, dict[str, Any] | None, int, str | None]]) -> dict[int, tuple]:
    """The replica: each good event applied in log order, its row as Postgres gives it back."""
    rows: dict[int, tuple] = {}
    for key, envelope, _, reason in changes:
        if envelope is None or reason is not None:
            continue
        if envelope["op"] == "d":
            rows.pop(key, None)
            continue
        after = envelope["after"]
        rows[key] = (after["customer"], after["amount"], datetime.fromisoformat(after["placed_at"]),
                     datetime(1970, 1, 1) + timedelta(microseconds=after["created"]),
                     None if after["day"] is None else date(1970, 1, 1) + timedelta(days=after["day"]),
                     after.get("note"), envelope["source"]["lsn"])
    return rows


def produce(url: str, bootstrap: str, topic: str, changes: list) -> list[tuple[int, int, str | None]]:
    """Send each change (with a hazard or two of its own); (partition, offset, reason words) of each record."""
    client = SchemaRegistryClient({"url": url})
    values = {1: AvroSerializer(client, json.dumps(ENVELOPE)), 2: AvroSerializer(client, json.dumps(ENVELOPE2))}
    keys = AvroSerializer(client, json.dumps(KEY))
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = []
    for i, (key, envelope, version, reason) in enumerate(changes):
        key_bytes = keys({"id": key}, SerializationContext(topic, MessageField.KEY))
        value = None if envelope is None else values[version](envelope, SerializationContext(topic,
                                                                                              MessageField.VALUE))
        if i % 37 == 5 and value is not None and reason is None:  # a copy with another magic byte, besides the event
            sent.append((producer.send(topic, key=key_bytes, value=b"\x01" + value[1:]), "magic byte 0"))
        sent.append((producer.send(topic, key=key_bytes, value=value), reason))
    producer.flush()
    coords = [(future.get(timeout=30).partition, future.get(timeout=30).offset, reason) for future, reason in sent]
    producer.close()
    return coords


def write_spec(directory: Path, topic: str) -> Path:
    fields = {"id": "int", "customer": "string", "amount": "decimal(10,2)", "placed_at": "timestamp",
              "created": {"type": "timestamp_ntz", "unit": "us"}, "day": "date", "note": "string"}
    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 60, "commit_group_offsets": False,
                   "key": {"format": "debezium", "converter": "avro", "fields": {"id": "int"}},
                   "value": {"format": "debezium", "converter": "avro", "fields": fields}},
        "sinks": [{"name": "replica", "type": "postgres_upsert", "table": "orders_replica",
                   "columns": {"id": "integer", "customer": "text", "amount": "numeric", "placed_at": "timestamptz",
                               "created": "timestamp", "day": "date", "note": "text", "__lsn": "bigint"},
                   "keys": ["id"], "order_by": "__lsn", "delete_column": "__deleted",
                   "sql": "SELECT id, customer, amount, placed_at, created, day, note, __lsn, __deleted FROM records"}],
        "retries": {"count": 2, "delay_seconds": 1, "backoff": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, "auto"),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def test_debezium_avro_changes_land_as_their_source(service_env, topic, kafka, ledger_url, registry, tmp_path):
    specs = write_spec(tmp_path / "pipelines", topic)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_SCHEMA_REGISTRY_URL": registry.url,
           **pipeline_dag_folder(tmp_path, PIPELINE)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    changes = history(random.Random(65), 160)
    coords = produce(registry.url, kafka.bootstrap_servers, topic, changes)
    bad = {(p, o): words for p, o, words in coords if words is not None}
    assert len(bad) >= 3 and any(envelope is None for _, envelope, _, _ in changes)

    result = subprocess.run([sys.executable, "-m", "microbatch.cli", "run", PIPELINE, "--max-runs", "10"],
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False)
    (tmp_path / "run.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]

    with transaction(ledger_url) as session:
        replica = {row[0]: tuple(row[1:]) for row in session.execute(text(
            "SELECT id, customer, amount, placed_at, created, day, note, __lsn FROM orders_replica"))}
        dead = {(p, o): error for p, o, error in session.execute(text(
            'SELECT partition, "offset", error FROM dead_letters'))}
    assert replica == expected(changes)
    assert sorted(dead) == sorted(bad)
    for coordinates, words in bad.items():
        assert words in dead[coordinates], (coordinates, words, dead[coordinates])
    with transaction(ledger_url) as session:
        pinned = [row[0] for row in session.execute(text("SELECT formats FROM batches ORDER BY id"))]
    value_ids = {int(i) for i in pinned[0]["value"]["writers"]}
    key_ids = {int(i) for i in pinned[0]["key"]["writers"]}
    assert len(value_ids) == 2 and len(key_ids) == 1 and not value_ids & key_ids
    assert all(p["value"]["subject"] == f"{topic}-value" and p["value"]["version"] == 2 for p in pinned), pinned
    assert all(set(p["key"]["met"]) <= key_ids and set(p["value"]["met"]) <= value_ids for p in pinned), pinned
    assert set().union(*(p["value"]["met"] for p in pinned)) == value_ids, "each side's writers its read met"
    audit = cli(env, "verify", PIPELINE)
    assert audit.returncode == 0, audit.stdout + audit.stderr
