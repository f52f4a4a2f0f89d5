"""Avro payment events through a schema registry, end to end (issue 47), on real Kafka, Postgres, Spark, Airflow
(`dag.test()` through `microbatch run`) and Apicurio Registry (a registry of the test's own, which it stops):

- the records are written by confluent-kafka's `AvroSerializer` (the Confluent wire format), interleaving two schema
  versions (v2 adds `currency` with a default), keyed by payment id (`source.key: text`), with tombstones and the
  hazards: an unknown schema id, plain Avro without the header, a truncated payload, a value shorter than the header;
- `source.value: {format: avro, fields: ...}` into the payments job's upsert keyed by the record key and its windowed
  aggregate (`spark_jobs/payments_example.py`), first through the suite's Spark Connect server (`spark.mode: auto`)
  with a Connect Python worker killed mid-decode and the runner killed on both sides of the commit;
- then v3 changes `amount_cents` to a double: a new batch is refused in one sentence before anything is written;
- then, with the registry stopped, a replay of a partition through spark-submit decodes with the schemas the ledger
  pinned (the same tables), and a scheduled run fails in one sentence, nothing written.

The oracle decodes every produced value with fastavro (writer schema by the header's id, into v2), not with the
platform's code."""

from __future__ import annotations

import io
import json
import os
import random
import struct
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaProducer
from sqlalchemy import text

from microbatch.dev.process import free_port
from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from tests.e2e.helpers import cli, pipeline_dag_folder, positions, spark_section

pytestmark = pytest.mark.e2e

PIPELINE = "payments"
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
WINDOW = 60
V1 = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "payment_id", "type": "string"}, {"name": "merchant", "type": "string"},
    {"name": "amount_cents", "type": "long"}, {"name": "status", "type": ["null", "string"], "default": None},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
V3 = {**V2, "fields": [{**f, "type": "double"} if f["name"] == "amount_cents" else f for f in V2["fields"]]}
FIELDS = {"payment_id": "string", "merchant": "string", "amount_cents": "bigint", "status": "string",
          "ts": "timestamp"}


@pytest.fixture
def registry(tmp_path: Path):
    from microbatch.dev.registry import SchemaRegistry

    running = SchemaRegistry(tmp_path / "registry").start()
    yield running
    running.stop()


def registered(url: str, subject: str) -> dict[int, tuple[int, dict]]:
    """Every version of `subject`: its id and schema, read with plain HTTP (not the platform's client)."""
    out = {}
    with urllib.request.urlopen(f"{url}/subjects/{subject}/versions", timeout=30) as response:
        versions = json.load(response)
    for version in versions:
        with urllib.request.urlopen(f"{url}/subjects/{subject}/versions/{version}", timeout=30) as response:
            body = json.load(response)
        out[int(version)] = (int(body["id"]), json.loads(body["schema"]))
    return out


def generate(url: str, topic: str, seed: int, count: int) -> list[tuple[bytes | None, bytes | None, str | None]]:
    """(key, value, the words of its reason when bad): v1 and v2 interleaved, tombstones, hazards, a record without
    a key and a negative amount (the job's own refusal)."""
    client = SchemaRegistryClient({"url": url})
    writers = {name: AvroSerializer(client, json.dumps(schema)) for name, schema in (("v1", V1), ("v2", V2))}
    context = SerializationContext(topic, MessageField.VALUE)
    rng = random.Random(seed)
    out: list[tuple[bytes | None, bytes | None, str | None]] = []
    for i in range(count):
        pid = f"pay-{rng.randrange(30):03d}"
        body = {"payment_id": pid, "merchant": f"m{rng.randrange(4)}", "amount_cents": rng.randrange(100, 50_000),
                "status": rng.choice([None, "captured", "refunded"]), "ts": T0 + timedelta(seconds=i / 3)}
        version = rng.choice(["v1", "v2"])
        value = writers[version]({**body, "currency": "USD"} if version == "v2" else body, context)
        roll = rng.random()
        if roll < 0.08:
            out.append((pid.encode(), None, None))
        elif roll < 0.09:
            out.append((pid.encode(), b"\x00" + struct.pack(">I", 424242) + value[5:], "schema id 424242"))
        elif roll < 0.10:
            plain = io.BytesIO()
            fastavro.schemaless_writer(plain, fastavro.parse_schema(V1), body)
            out.append((pid.encode(), plain.getvalue(), "magic byte 0"))
        elif roll < 0.11:
            out.append((pid.encode(), value[:-6], "does not decode"))
        elif roll < 0.115:
            out.append((pid.encode(), value[:3], "shorter than the 5-byte header"))
        elif roll < 0.12:
            out.append((None, value, "no key"))
        elif roll < 0.13:
            out.append((pid.encode(), writers["v1"]({**body, "amount_cents": -5}, context), "amount_cents is negative"))
        else:
            out.append((pid.encode(), value, None))
    return out


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, str | None]]) -> list:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    futures = [producer.send(topic, key=k, value=v) for k, v, _ in records]
    producer.flush()
    coords = [(f.get(timeout=30).partition, f.get(timeout=30).offset) for f in futures]
    producer.close()
    return coords


def oracle(records: list, coords: list, schemas: dict[int, dict]) -> tuple[dict, dict, dict]:
    """(latest per key, totals per window and merchant, dead letters' coordinates -> reason words), decoding each
    good value with fastavro into v2."""
    reader = fastavro.parse_schema(V2)
    latest: dict[str, tuple] = {}
    totals: dict[tuple, tuple[int, int]] = {}
    dead = {}
    for (partition, offset), (key, value, reason) in sorted(zip(coords, records, strict=True)):
        if reason is not None:
            dead[(partition, offset)] = reason
            continue
        if value is None:
            latest.pop(key.decode(), None)
            continue
        (schema_id,) = struct.unpack(">I", value[1:5])
        body = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(schemas[schema_id]), reader)
        latest[key.decode()] = (body["merchant"], body["amount_cents"], body["status"], body["ts"], partition, offset)
        start = T0 + timedelta(seconds=(body["ts"] - T0).total_seconds() // WINDOW * WINDOW)
        window = (start, start + timedelta(seconds=WINDOW), body["merchant"])
        amount, count = totals.get(window, (0, 0))
        totals[window] = (amount + body["amount_cents"], count + 1)
    return latest, totals, dead


def write_spec(directory: Path, topic: str, spark_mode: str) -> Path:
    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 200, "commit_group_offsets": False, "key": "text",
                   "value": {"format": "avro", "fields": FIELDS}},
        "job": {"transform": "spark_jobs.payments_example:transform",
                "options": {"window_seconds": WINDOW, "allowed_lateness_seconds": 3600}},
        "sinks": [
            {"name": "payments_latest", "type": "postgres_upsert", "table": "payments_latest",
             "keys_from": "record_key", "columns": {"key_text": "text", "merchant": "text", "amount_cents": "bigint",
                                                    "status": "text", "ts": "timestamptz"}},
            {"name": "payments_log", "type": "postgres_append", "table": "payments_log",
             "columns": {"payment_id": "text", "amount_cents": "bigint", "traceparent": "text"}},
            {"name": "merchant_totals", "type": "postgres_aggregate", "table": "merchant_totals",
             "columns": {"window_start": "timestamptz", "window_end": "timestamptz", "merchant": "text",
                         "amount_cents": "bigint", "payments": "bigint"},
             "keys": ["window_start", "window_end", "merchant"], "sum_columns": ["amount_cents", "payments"],
             "window": {"start": "window_start", "end": "window_end"}},
        ],
        "retries": {"count": 2, "delay_seconds": 1, "backoff": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, spark_mode),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def run(env: dict[str, str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "microbatch.cli", "run", PIPELINE, "--max-runs", "10"],
                          env={**os.environ, **env, **(extra or {})}, capture_output=True, text=True, timeout=900,
                          check=False)


def tables(url: str) -> tuple[dict, dict, dict]:
    with transaction(url) as session:
        latest = {k: (m, a, s, ts, p, o) for k, m, a, s, ts, p, o in session.execute(text(
            'SELECT key_text, merchant, amount_cents, status, ts, partition, "offset" FROM payments_latest'))}
        totals = {(s, e, m): (a, n) for s, e, m, a, n in session.execute(text(
            "SELECT window_start, window_end, merchant, amount_cents, payments FROM merchant_totals"))}
        dead = {(p, o): error for p, o, error in session.execute(text(
            'SELECT partition, "offset", error FROM dead_letters'))}
    return latest, totals, dead


def batch_count(url: str) -> int:
    with transaction(url) as session:
        return session.execute(text("SELECT count(*) FROM batches")).scalar_one()


ARMED = "stage.read=30:kill,commit.before_commit,commit.after_commit=kill"


def test_avro_through_a_registry_exactly_once_and_replayed_with_the_pinned_schemas(
        service_env, topic, kafka, ledger_url, registry, tmp_path):
    subject = f"{topic}-value"
    specs = write_spec(tmp_path / "pipelines", topic, "auto")
    # The registry through the Airflow connection `schema_registry_default`, as a deployment without the variable
    # has it (the variable, the local stack's and compose's way, takes over below).
    connection = {"conn_type": "http", "extra": {"url": registry.url}}
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_SCHEMA_REGISTRY_URL": "",
           "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps(connection), **pipeline_dag_folder(tmp_path, PIPELINE)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    records = generate(registry.url, topic, seed=47, count=400)
    coords = produce(kafka.bootstrap_servers, topic, records)
    versions = registered(registry.url, subject)
    schemas = dict(versions.values())
    assert len(schemas) == 2
    latest, totals, dead = oracle(records, coords, schemas)
    assert len(dead) > 10 and any(r[1] is None for r in records)

    markers = tmp_path / "fired"
    deaths = []
    for attempt in range(5):
        result = run(env, {FAILPOINTS_ENV: ARMED, FAILPOINT_DIR_ENV: str(markers)})
        (tmp_path / f"run{attempt}.log").write_text(result.stdout + result.stderr)
        if result.returncode == 0:
            break
        deaths.append(result.returncode)
        assert result.returncode in (EXIT_CODE, -9), result.stdout[-3000:] + result.stderr[-3000:]
    else:
        pytest.fail(f"the pipeline never caught up after {len(deaths)} deaths; logs in {tmp_path}")
    assert {p.name for p in markers.iterdir()} == {"stage.read", "commit.before_commit", "commit.after_commit"}

    def check() -> None:
        got_latest, got_totals, got_dead = tables(ledger_url)
        assert got_latest == latest
        assert got_totals == totals
        assert sorted(got_dead) == sorted(dead)
        for coordinates, words in dead.items():
            assert words in got_dead[coordinates], (coordinates, words, got_dead[coordinates])
        audit = cli(env, "verify", PIPELINE)
        assert audit.returncode == 0, audit.stdout + audit.stderr

    check()
    with transaction(ledger_url) as session:
        pins = [row[0]["value"] for row in session.execute(text("SELECT formats FROM batches ORDER BY id"))]
        kept = set(session.execute(text("SELECT schema_id FROM registry_schemas")).scalars())
    reader_id = versions[2][0]
    assert all(p["subject"] == subject and p["version"] == 2 and p["reader_id"] == reader_id for p in pins), pins
    assert set().union(*(p["met"] for p in pins)) == set(schemas) == kept

    # From here the registry comes through MICROBATCH_SCHEMA_REGISTRY_URL, which wins over the connection (now
    # naming a port where nothing listens): the plan below reads version 3 through it.
    nowhere = {"conn_type": "http", "extra": {"url": f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"}}
    env = {**env, "MICROBATCH_SCHEMA_REGISTRY_URL": registry.url,
           "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps(nowhere)}

    # v3 reads amount_cents as a double: a new batch is refused before anything is written.
    SchemaRegistryClient({"url": registry.url}).register_schema(subject, _schema(V3))
    more = generate(registry.url, topic, seed=48, count=20)
    produce(kafka.bootstrap_servers, topic, more)
    before = batch_count(ledger_url)
    refused = run(env)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert (f"source.value.fields.amount_cents: the field 'amount_cents' of the reader schema (subject '{subject}' "
            "version 3) reads as double, not bigint; if a newer version changed its type, pin the reader schema to "
            "the last version where it is bigint (`version: N` in source.value") in output, output[-3000:]
    assert batch_count(ledger_url) == before

    # The registry is down: a replay decodes with the schemas the ledger pinned, through spark-submit.
    registry.stop()
    with transaction(ledger_url) as session:
        partition, start, end = session.execute(text(
            "SELECT partition, min(start_offset), max(end_offset) FROM ranges WHERE committed GROUP BY partition "
            "ORDER BY count(*) DESC, partition LIMIT 1")).one()
        session.execute(text("UPDATE payments_latest SET amount_cents = 0 WHERE partition = :p"), {"p": partition})
    write_spec(specs, topic, "submit")
    cursor = positions(ledger_url)
    replayed = cli(env, "backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--partitions", str(partition),
                   "--start", str(start), "--end", str(end))
    assert replayed.returncode == 0, (replayed.stdout + replayed.stderr)[-4000:]
    check()
    assert positions(ledger_url) == cursor

    # A scheduled run with the registry down: retried, then one sentence; nothing written.
    before = batch_count(ledger_url)
    down = run(env)
    output = down.stdout + down.stderr
    assert down.returncode != 0
    assert "The schema registry at http://127.0.0.1:" in output and "could not be reached" in output, output[-3000:]
    assert batch_count(ledger_url) == before


def _schema(schema: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(schema), "AVRO")
