"""Kafka output from a SQL output (issue 46) on real Kafka, Postgres, Spark (the suite's Connect server) and Airflow
(`dag.test()`): a YAML-only pipeline whose kafka sink publishes the rows of its own query (no Postgres table in
between), keyed, with headers of the source coordinates.

- Without its output topic the plan refuses in one sentence that says to run `migrate`, and nothing is planned;
  `microbatch migrate` creates the topic with the spec's partitions.
- The publisher is killed between two Kafka transactions (SIGKILL); the next run finishes: a read_committed
  reader sees every captured payment exactly once (its key, value and headers), nothing else.
- A replay of everything with the job unchanged publishes nothing; after the query changes, a replay publishes
  exactly a correction for each row whose content changed and a retraction for each row that disappeared, and a
  consumer that applies the topic (last value per coordinates, a retraction removes) ends equal to the new oracle.

The oracle reads the produced payments with Python's `json`, never with the project's code."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import produce_lines
from microbatch.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from microbatch.sinks.schema import migrate_sinks
from tests.e2e.helpers import cli, read_topic, spark_section
from tests.e2e.test_dead_letters_e2e import Payment
from tests.e2e.test_delta_sink_e2e import dag_folder

pytestmark = pytest.mark.e2e

PIPELINE = "payouts"
CAPTURED = "SELECT payment_id, merchant, amount_cents FROM records WHERE status = 'captured'"
CHANGED = ("SELECT payment_id, CASE WHEN merchant = 'm1' THEN 'M1' ELSE merchant END AS merchant, amount_cents "
           "FROM records WHERE status = 'captured' AND amount_cents < 9000")


def generate() -> list[Payment]:
    """600 payments of three merchants, about half captured, and 6 records that are not JSON."""
    rng = random.Random(46)
    out = []
    for i in range(600):
        body = {"payment_id": f"p{i}", "merchant": f"m{rng.randrange(3)}", "amount_cents": rng.randrange(100, 12_000),
                "status": rng.choice(["captured", "captured", "authorized", "failed"])}
        out.append(Payment(json.dumps(body).encode(), body["merchant"]))
        if i % 100 == 0:
            out.append(Payment(b"{not json", "m0", json_ok=False))
    return out


def write_spec(directory: Path, topic: str, sql: str) -> None:
    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 250, "commit_group_offsets": False,
                   "value": {"format": "json", "required": ["payment_id"],
                             "fields": {"payment_id": "string", "merchant": "string", "amount_cents": "bigint",
                                        "status": "string"}}},
        "sinks": [{"name": "captured", "type": "kafka", "topic": f"{topic}_captured", "key": "payment_id",
                   "columns": {"payment_id": "text", "merchant": "text", "amount_cents": "bigint"}, "sql": sql,
                   "headers": {"source-partition": "partition", "source-offset": "offset"}, "partitions": 3,
                   "transaction_size": 40}],
        "retries": {"count": 1, "delay_seconds": 1, "backoff": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, "auto"),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def microbatch(env: dict[str, str], *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env={**os.environ, **env, **(extra or {})},
                          capture_output=True, text=True, timeout=900, check=False)


def oracle(payments: list[Payment], coords: list[tuple[int, int]], *, changed: bool = False) -> dict:
    """(partition, offset) -> (key, value) of each row the query gives, from the produced JSON."""
    rows = {}
    for (partition, offset), payment in zip(coords, payments, strict=True):
        if not payment.json_ok:
            continue
        body = json.loads(payment.value)
        if body["status"] != "captured" or (changed and body["amount_cents"] >= 9000):
            continue
        merchant = "M1" if changed and body["merchant"] == "m1" else body["merchant"]
        rows[(partition, offset)] = (body["payment_id"], {"payment_id": body["payment_id"], "merchant": merchant,
                                                          "amount_cents": body["amount_cents"]})
    return rows


def published(bootstrap: str, topic: str) -> list:
    return read_topic(bootstrap, f"{topic}_captured")


def applied(records: list, topic: str) -> dict:
    """What a consumer keeps of the topic, read in sequence order: the last value per source coordinates, a
    retraction removing it."""
    kept: dict = {}
    for record in records:
        value = json.loads(record.value)
        coordinates = (value.pop("partition"), value.pop("offset"))
        assert value.pop("topic") == topic
        value.pop("correction", None)
        if value.pop("retraction", False):
            kept.pop(coordinates, None)
        else:
            kept[coordinates] = (record.key.decode(), value)
    return kept


def test_a_kafka_sink_publishes_its_own_query_once_and_a_replay_only_what_changed(service_env, topic, kafka,
                                                                                   ledger_url, tmp_path):
    specs = tmp_path / "pipelines"
    write_spec(specs, topic, CAPTURED)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **dag_folder(tmp_path, PIPELINE)}
    payments = generate()
    coords = produce_lines(kafka.bootstrap_servers, topic, payments)

    # The sink's tables only (as a migrate of an older version left them): the plan refuses, nothing is planned.
    migrate_sinks(ledger_url, specs)
    refused = microbatch(env, "run", PIPELINE, "--max-runs", "1")
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0
    assert f"The output topic '{topic}_captured' of sink 'captured' does not exist, so no batch was planned" in said, \
        said[-3000:]
    assert "Run `microbatch migrate`" in said and "Traceback" not in refused.stdout
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == 0

    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert f"created topic {topic}_captured (3 partition(s))" in migrated.stdout, migrated.stdout
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        assert consumer.partitions_for_topic(f"{topic}_captured") == {0, 1, 2}
    finally:
        consumer.close()

    # The publisher is killed between two transactions; the next run publishes the rest.
    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: "publish.between_transactions=kill", FAILPOINT_DIR_ENV: str(markers)}
    first = microbatch(env, "run", PIPELINE, "--max-runs", "6", extra=armed)
    assert first.returncode != 0 and (markers / "publish.between_transactions").exists(), \
        (first.stdout + first.stderr)[-3000:]
    second = microbatch(env, "run", PIPELINE, "--max-runs", "6", extra=armed)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    expected = oracle(payments, coords)
    records = published(kafka.bootstrap_servers, topic)
    seqs = [int(dict(r.headers)["microbatch.seq"]) for r in records]
    assert sorted(seqs) == list(range(1, len(expected) + 1)), "each row once: no gap, no duplicate"
    got = {}
    for record in records:
        value = json.loads(record.value)
        coordinates = (value.pop("partition"), value.pop("offset"))
        assert value.pop("topic") == topic and "correction" not in value
        headers = dict(record.headers)
        assert (int(headers["source-partition"]), int(headers["source-offset"])) == coordinates
        got[coordinates] = (record.key.decode(), value)
    assert got == expected
    assert cli(env, "verify", PIPELINE).returncode == 0
    with transaction(ledger_url) as session:
        dead = session.execute(text("SELECT count(*) FROM dead_letters")).scalar_one()
    assert dead == sum(1 for p in payments if not p.json_ok)

    # A replay of everything with the same query publishes nothing.
    replay = ("backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--start", "0", "--end", "latest")
    same = microbatch(env, *replay)
    assert same.returncode == 0, (same.stdout + same.stderr)[-3000:]
    assert len(published(kafka.bootstrap_servers, topic)) == len(records)

    # The query changes: a replay publishes a correction per changed row and a retraction per disappeared row.
    write_spec(specs, topic, CHANGED)
    redone = microbatch(env, *replay)
    assert redone.returncode == 0, (redone.stdout + redone.stderr)[-3000:]
    after = sorted(published(kafka.bootstrap_servers, topic), key=lambda r: int(dict(r.headers)["microbatch.seq"]))
    new = [json.loads(r.value) for r in after[len(records):]]  # in sequence order: the replay's come last
    assert all(v.get("correction") is True for v in new)
    target = oracle(payments, coords, changed=True)
    retracted = {(v["partition"], v["offset"]) for v in new if v.get("retraction")}
    corrected = {(v["partition"], v["offset"]) for v in new if not v.get("retraction")}
    assert retracted == set(expected) - set(target)
    assert corrected == {co for co in target if target[co] != expected[co]}
    assert len(new) == len(retracted) + len(corrected), "one record per changed or disappeared row"
    assert applied(after, topic) == target
    assert cli(env, "verify", PIPELINE).returncode == 0
