"""Real Kafka records end to end (issue 43): keyed JSON payment events with headers and tombstones, their value decoded
by the platform (`source.value: json` with declared fields, `source.key: text`), on real Kafka, Postgres, Spark and
Airflow (`dag.test()`), into three sinks of `spark_jobs/payments_example.py`:

- `payments_latest`, a `postgres_upsert` keyed by the record key (`keys_from: record_key`): per key, the latest
  record in Kafka's order, a tombstone (the key with a null value) deleting it;
- `payments_log`, a `postgres_append` whose `traceparent` column is the record's header of that name;
- `merchant_totals`, a windowed `postgres_aggregate` over the typed `ts` and `amount_cents` the job reads.

The first runs go through the shared Spark Connect server (the shipped `spark.mode: auto`) with failpoints armed: a
Connect Python worker dies mid-decode (`stage.read`, SIGKILL), and the runner dies on both sides of the commit
(`os._exit` inside its open transaction, SIGKILL after it); `microbatch run` is started again until it exits 0.
Then a replay of a partition's committed ranges, tombstones among them, runs through spark-submit (the suite's smoke
run of that path) and must leave every table as it was. Every expectation is computed here from the produced
records with Python's `json` module and plain checks, not by the platform's decode: the tables, the dead letters'
coordinates and the field each reason names."""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from kafka import KafkaProducer
from sqlalchemy import text

from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from tests.e2e.helpers import cli, pipeline_dag_folder, positions, run_log, spark_section

pytestmark = pytest.mark.e2e

PIPELINE = "payments"
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
FIELDS = {"payment_id": "string", "merchant": "string", "amount_cents": "bigint", "status": "string",
          "ts": {"type": "timestamp", "unit": "ms"}}  # epoch milliseconds, as most producers write a time (issue 59)
REQUIRED = ["payment_id", "amount_cents", "ts"]
WINDOW = 60

ON_JVM = "decode: the value in one pass by the formats jar's Java function"


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    reason: str | None = None
    """The words the platform's or the job's reason must hold when the record is a dead letter."""


def payment(pid: str, merchant: str, amount: int, when: datetime, status: str | None = "captured") -> dict:
    millis = int(when.timestamp() * 1000)  # a JSON integer, or now and then a string of its digits
    body = {"payment_id": pid, "merchant": merchant, "amount_cents": amount,
            "ts": str(millis) if millis % 7 == 0 else millis}
    if status is not None:
        body["status"] = status
    return body


def generate(seed: int) -> list[Record]:
    """500 events of 40 payments over 125 s: updates with a traceparent header, tombstones, and bad records of
    every kind (non-JSON, a field of another type, a required field missing, a key that is not UTF-8, no key, and
    a negative amount, which the job refuses)."""
    rng = random.Random(seed)
    out: list[Record] = []
    for i in range(500):
        when = T0 + timedelta(seconds=i / 4)
        pid = f"pay-{rng.randrange(40):03d}"
        headers = [("traceparent", f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01".encode()),
                   ("source", b"checkout")]
        body = payment(pid, f"m{rng.randrange(5)}", rng.randrange(100, 50_000), when,
                       None if rng.random() < 0.1 else rng.choice(["captured", "refunded"]))
        roll = rng.random()
        if roll < 0.08:
            out.append(Record(pid.encode(), None, headers))  # a tombstone: the payment is forgotten
        elif roll < 0.09:
            out.append(Record(pid.encode(), b'{"payment_id": "' + pid.encode() + b'", "amount', headers, "not JSON"))
        elif roll < 0.10:
            out.append(Record(pid.encode(), json.dumps({**body, "amount_cents": str(body["amount_cents"])}).encode(),
                              headers, "'amount_cents' is not a bigint"))
        elif roll < 0.11:
            out.append(Record(pid.encode(), json.dumps({k: v for k, v in body.items() if k != "ts"}).encode(),
                              headers, "required field 'ts'"))
        elif roll < 0.115:
            out.append(Record(b"\xff" + pid.encode(), json.dumps(body).encode(), headers, "key is not valid UTF-8"))
        elif roll < 0.12:
            out.append(Record(None, json.dumps(body).encode(), headers, "no key"))
        elif roll < 0.13:
            out.append(Record(pid.encode(), json.dumps({**body, "amount_cents": -5}).encode(), headers,
                              "amount_cents is negative"))
        else:
            out.append(Record(pid.encode(), json.dumps(body).encode(), headers))
    return out


def produce(bootstrap: str, topic: str, records: list[Record]) -> list[tuple[int, int]]:
    """Send the records with kafka-python's default partitioner (by key; round robin without one); their
    (partition, offset)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    futures = [producer.send(topic, key=r.key, value=r.value, headers=r.headers) for r in records]
    producer.flush()
    coords = [(f.get(timeout=30).partition, f.get(timeout=30).offset) for f in futures]
    producer.close()
    return coords


def decoded(record: Record) -> dict | None:
    """The record's value as Python's json module reads it, when the record is one the job is given (not bad)."""
    if record.reason is not None or record.value is None:
        return None
    body = json.loads(record.value)
    body["ts"] = datetime.fromtimestamp(int(body["ts"]) / 1000, tz=UTC)
    return body


def expected_latest(records: list[Record], coords: list[tuple[int, int]]) -> dict[str, tuple]:
    """Each key's greatest record by (partition, offset) among the good ones and the tombstones; a tombstone
    deletes the key."""
    table: dict[str, tuple] = {}
    for (partition, offset), r in sorted(zip(coords, records, strict=True), key=lambda item: item[0]):
        if r.reason is not None:
            continue
        key = r.key.decode()
        if r.value is None:
            table.pop(key, None)
        else:
            body = decoded(r)
            table[key] = (body["merchant"], body["amount_cents"], body.get("status"), body["ts"], partition, offset)
    return table


def expected_log(records: list[Record], coords: list[tuple[int, int]]) -> dict[tuple[int, int], tuple]:
    out = {}
    for co, r in zip(coords, records, strict=True):
        body = decoded(r)
        if body is not None:
            out[co] = (body["payment_id"], body["amount_cents"], dict(r.headers)["traceparent"].decode())
    return out


def expected_totals(records: list[Record]) -> dict[tuple, tuple[int, int]]:
    totals: dict[tuple, tuple[int, int]] = {}
    for r in records:
        body = decoded(r)
        if body is None:
            continue
        start = T0 + timedelta(seconds=(body["ts"] - T0).total_seconds() // WINDOW * WINDOW)
        key = (start, start + timedelta(seconds=WINDOW), body["merchant"])
        amount, count = totals.get(key, (0, 0))
        totals[key] = (amount + body["amount_cents"], count + 1)
    return totals


def write_spec(directory: Path, topic: str, spark_mode: str) -> Path:
    spec = {
        "name": PIPELINE,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 250, "commit_group_offsets": False,
                   "include_headers": True, "key": "text",
                   "value": {"format": "json", "fields": FIELDS, "required": REQUIRED}},
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
        "retries": {"count": 4, "delay_seconds": 1, "backoff": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, spark_mode),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def run_pipeline(env: dict[str, str], extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`microbatch run payments` in its own process until caught up: a crash failpoint kills only that process."""
    return subprocess.run([sys.executable, "-m", "microbatch.cli", "run", PIPELINE, "--max-runs", "12"],
                          env={**os.environ, **env, **extra_env}, capture_output=True, text=True, timeout=900,
                          check=False)


def tables(url: str) -> tuple[dict, dict, dict, dict]:
    with transaction(url) as session:
        latest = {k: (m, a, s, ts, p, o) for k, m, a, s, ts, p, o in session.execute(text(
            'SELECT key_text, merchant, amount_cents, status, ts, partition, "offset" FROM payments_latest'))}
        log = {(p, o): (pid, a, tp) for pid, a, tp, p, o in session.execute(text(
            'SELECT payment_id, amount_cents, traceparent, partition, "offset" FROM payments_log'))}
        totals = {(s, e, m): (a, n) for s, e, m, a, n in session.execute(text(
            "SELECT window_start, window_end, merchant, amount_cents, payments FROM merchant_totals"))}
        dead = {(p, o): (error, key, headers) for p, o, error, key, headers in session.execute(text(
            'SELECT partition, "offset", error, key, headers FROM dead_letters'))}
    return latest, log, totals, dead


ARMED = "stage.read=60:kill,commit.before_commit,commit.after_commit=kill"
RUNNER_POINTS = ["commit.before_commit", "commit.after_commit"]  # the stage's runner deaths are the row sinks' e2e


def test_keyed_json_records_with_headers_and_tombstones(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_spec(tmp_path / "pipelines", topic, "auto")
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **pipeline_dag_folder(tmp_path, PIPELINE)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    records = generate(seed=43)
    coords = produce(kafka.bootstrap_servers, topic, records)
    latest, log, totals = expected_latest(records, coords), expected_log(records, coords), expected_totals(records)
    tombstoned = {r.key for r in records if r.value is None and r.reason is None}
    assert tombstoned and len(latest) < 40, "some payments must be deleted at the end"

    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: ARMED, FAILPOINT_DIR_ENV: str(markers)}
    deaths = []
    for attempt in range(len(RUNNER_POINTS) + 3):
        result = run_pipeline(env, armed)
        (tmp_path / f"run{attempt}.log").write_text(result.stdout + result.stderr)
        if result.returncode == 0:
            break
        deaths.append(result.returncode)
        assert result.returncode in (EXIT_CODE, -9), result.stdout[-3000:] + result.stderr[-3000:]
    else:
        pytest.fail(f"the pipeline never caught up after {len(deaths)} deaths; logs in {tmp_path}")
    assert {p.name for p in markers.iterdir()} == {"stage.read", *RUNNER_POINTS}
    assert len(deaths) == len(RUNNER_POINTS), deaths
    # The value decoded by the formats jar's Java function on the suite's Connect server (which has the jar, as the
    # local stack's has), as spark-submit decodes it below.
    assert ON_JVM in run_log(result), run_log(result)[-3000:]

    def check() -> None:
        got_latest, got_log, got_totals, dead = tables(ledger_url)
        assert got_latest == latest
        assert got_log == log
        assert got_totals == totals
        bad = {co: r for co, r in zip(coords, records, strict=True) if r.reason is not None}
        assert sorted(dead) == sorted(bad)
        for co, r in bad.items():
            error, key, headers = dead[co]
            assert r.reason in error, (co, r.reason, error)
            assert key == r.key
            assert [(h["key"], h["value"]) for h in headers][:1] == [
                ("traceparent", base64.b64encode(r.headers[0][1]).decode())]
        audit = cli(env, "verify", PIPELINE)
        assert audit.returncode == 0, audit.stdout + audit.stderr

    check()
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches WHERE state <> 'committed'")).scalar_one() == 0
        assert session.execute(text("SELECT max(attempt) FROM batches")).scalar_one() >= 2
        ranges = session.execute(text(
            "SELECT partition, min(start_offset), max(end_offset) FROM ranges WHERE committed GROUP BY partition "
            "ORDER BY partition")).all()

    # A replay of the partition with the most tombstones, through spark-submit, leaves every table as it was.
    by_partition = {p: sum(1 for co, r in zip(coords, records, strict=True)
                           if co[0] == p and r.value is None and r.reason is None) for p, _, _ in ranges}
    partition, start, end = next(row for row in ranges if row[0] == max(by_partition, key=by_partition.get))
    assert by_partition[partition] > 0
    write_spec(specs, topic, "submit")
    cursor = positions(ledger_url)
    with transaction(ledger_url) as session:
        # Tampered: the replay rebuilds every key its range touches.
        session.execute(text("UPDATE payments_latest SET amount_cents = 0 WHERE partition = :p"), {"p": partition})
        session.execute(text("DELETE FROM payments_latest WHERE key_text = (SELECT min(key_text) FROM "
                             "payments_latest WHERE partition = :p)"), {"p": partition})
    replayed = cli(env, "backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--partitions", str(partition),
                   "--start", str(start), "--end", str(end))
    assert replayed.returncode == 0, (replayed.stdout + replayed.stderr)[-4000:]
    assert ON_JVM in run_log(replayed), run_log(replayed)[-3000:]
    check()
    assert positions(ledger_url) == cursor, "a replay never moves the scheduled cursor"


class LatestByProducerTime:
    """A test job for `test_record_keyed_upserts_order_by_the_record_timestamp`: each record's decoded columns and
    its Kafka `timestamp`, for two upsert sinks keyed by the record key and ordered by that timestamp."""

    def parse(self, records, options, state):
        from pyspark.sql import functions as F

        return records.select("topic", "partition", "offset", "value", "key_text", "merchant", "amount_cents",
                              "timestamp", F.lit(None).cast("string").alias("error"), F.lit(False).alias("late"))

    def state_metrics(self, options):
        return {}

    def next_state(self, state, metrics, options):
        return dict(state)

    def outputs(self, parsed, options, state):
        rows = parsed.select("key_text", "merchant", "amount_cents", "timestamp", "topic", "partition", "offset")
        return {"latest_pg": rows, "latest_lake": rows}


latest_by_producer_time = LatestByProducerTime()


def test_record_keyed_upserts_order_by_the_record_timestamp(service_env, topic, kafka, ledger_url, tmp_path):
    """`order_by: timestamp` (the record's Kafka timestamp, set out of offset order by the producer): in the
    Postgres upsert and the Delta upsert alike, a key's row is its record with the greatest (timestamp, partition,
    offset), a tombstone taking part by its record timestamp; read back with SQL and with delta-rs."""
    from deltalake import DeltaTable

    from tests.e2e.test_delta_sink_e2e import dag_folder

    columns = {"key_text": "text", "merchant": "text", "amount_cents": "bigint", "timestamp": "timestamptz"}
    upsert = {"keys_from": "record_key", "columns": columns, "order_by": "timestamp"}
    spec = {
        "name": "latest", "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 1000, "commit_group_offsets": False, "key": "text",
                   "value": {"format": "json", "fields": {"merchant": "string", "amount_cents": "bigint"},
                             "required": ["amount_cents"]}},
        "job": {"transform": "tests.e2e.test_keyed_records_e2e:latest_by_producer_time"},
        "sinks": [{"name": "latest_pg", "type": "postgres_upsert", "table": "latest_pg", **upsert},
                  {"name": "latest_lake", "type": "delta", "mode": "upsert", **upsert}],
        "retries": {"count": 2, "delay_seconds": 1, "backoff": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, "auto"),
    }
    specs = tmp_path / "pipelines"
    specs.mkdir()
    (specs / "latest.yaml").write_text(yaml.safe_dump(spec))
    warehouse = tmp_path / "warehouse"
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, "latest")}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    rng = random.Random(431)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=5)
    sent = []
    recent = int(datetime.now(UTC).timestamp() * 1000) - 600_000  # within the topic's retention
    for _ in range(300):
        key = f"k{rng.randrange(25):02d}".encode()
        millis = recent + rng.randrange(120_000)  # out of offset order
        value = None if rng.random() < 0.15 else json.dumps(
            {"merchant": f"m{rng.randrange(4)}", "amount_cents": rng.randrange(1, 9_999)}).encode()
        sent.append((key, value, millis, producer.send(topic, key=key, value=value, timestamp_ms=millis)))
    producer.flush()
    producer.close()
    winners: dict[str, tuple] = {}
    for key, value, millis, future in sent:
        meta = future.get(timeout=30)
        order = (millis, meta.partition, meta.offset)
        if key.decode() not in winners or order > winners[key.decode()][0]:
            winners[key.decode()] = (order, None if value is None else json.loads(value))
    expected = {k: (body["merchant"], body["amount_cents"], datetime.fromtimestamp(o[0] / 1000, UTC), o[1], o[2])
                for k, (o, body) in winners.items() if body is not None}
    deleted = {k for k, (_, body) in winners.items() if body is None}
    assert deleted and expected, "some keys must end deleted, some not"
    # Kafka's order alone would give another table: the test tells the two rules apart.
    by_offset: dict[str, bytes | None] = {}
    for key, value, _, _future in sorted(sent, key=lambda s: (s[3].get().partition, s[3].get().offset)):
        by_offset[key.decode()] = value
    assert {k for k, v in by_offset.items() if v is None} != deleted or any(
        json.loads(by_offset[k])["amount_cents"] != v[1] for k, v in expected.items() if by_offset[k] is not None)

    done = subprocess.run([sys.executable, "-m", "microbatch.cli", "run", "latest", "--max-runs", "3"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with transaction(ledger_url) as session:
        rows = session.execute(text('SELECT key_text, merchant, amount_cents, "timestamp", partition, "offset" '
                                    "FROM latest_pg")).all()
    assert {k: tuple(rest) for k, *rest in rows} == expected
    lake = DeltaTable(str(warehouse / "latest_lake")).to_pyarrow_table().to_pylist()
    assert {r["key_text"]: (r["merchant"], r["amount_cents"], r["timestamp"], r["partition"], r["offset"])
            for r in lake if not r["_deleted"]} == expected
    assert {r["key_text"] for r in lake if r["_deleted"]} == deleted
    audit = cli(env, "verify", "latest")
    assert audit.returncode == 0, audit.stdout + audit.stderr
