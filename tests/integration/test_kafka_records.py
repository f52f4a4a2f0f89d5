"""The record model (issue 43) on the real broker and the real ledger: what a job's `parse` is given, read through
the stage's own read path on the in-process Spark, against an oracle of the records the test produced; and the
headers that dead letters and late records keep with `source.include_headers` (migration 0014).

Records are produced with kafka-python: keyed and keyless, a tombstone, headers that repeat a key, carry an empty
value or bytes that are not UTF-8, explicit CreateTimes, and a topic whose broker sets LogAppendTime. (kafka-python
refuses a header with a null value, so none is produced.)"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from pyspark.sql import functions as F
from sqlalchemy import select, text

from microbatch.config import PIPELINES_DIR, PipelineSpec
from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import Ledger, transaction
from microbatch.ledger.models import DeadLetter, LateRecord
from microbatch.phases.commit import commit_batch
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from microbatch.sinks.schema import migrate
from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS
from microbatch.types import OffsetRange
from tests.integration.conftest import ledger_at_revision

pytestmark = pytest.mark.integration

Headers = list[tuple[str, bytes | None]]
CREATE_TIME, LOG_APPEND_TIME = 0, 1


@dataclass(frozen=True)
class Sent:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int | None = None


def make_spec(topic: str, include_headers: bool) -> PipelineSpec:
    data = yaml.safe_load((PIPELINES_DIR / "ip_count.yaml").read_text())
    data["source"] = {k: v for k, v in data["source"].items() if k != "topics"} | {
        "topics": [topic], "include_headers": include_headers}
    return PipelineSpec.model_validate(data)


def produce(bootstrap: str, topic: str, records: list[Sent]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_in_flight_requests_per_connection=1)
    try:
        for r in records:
            producer.send(topic, key=r.key, value=r.value, headers=r.headers, partition=r.partition,
                          timestamp_ms=r.timestamp_ms)
        producer.flush()
    finally:
        producer.close()


def by_offset(topic: str, records: list[Sent]) -> dict[tuple[int, int], Sent]:
    """What the test sent, by (partition, offset): one producer to a fresh topic, in order, so each partition's
    records take offsets 0, 1, 2... in the order sent."""
    seen: dict[int, int] = {}
    out = {}
    for r in records:
        offset = seen.get(r.partition, 0)
        seen[r.partition] = offset + 1
        out[(r.partition, offset)] = r
    return out


def broker_timestamps(bootstrap: str, topic: str, partitions: list[int], count: int) -> dict[tuple[int, int], Any]:
    """(timestamp ms, timestamp type) of each record as kafka-python reads it back: the timestamps the test did
    not set (the producer's clock, or the broker's under LogAppendTime)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        consumer.assign([KTP(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        return {(r.partition, r.offset): (r.timestamp, r.timestamp_type)
                for _, r in zip(range(count), consumer, strict=False)}
    finally:
        consumer.close()


def read_records(spark: Any, spec: PipelineSpec, bootstrap: str, ends: dict[int, int]) -> dict[tuple[int, int], Any]:
    """The records of [0, end) of each partition as the stage hands them to a job's `parse`, by (partition, offset),
    with the timestamp in epoch ms (so no time zone comes between)."""
    from microbatch.phases.stage import _read_ranges

    topic = spec.source.topics[0]
    records = _read_ranges(spark, spec, [OffsetRange(topic, p, 0, end) for p, end in ends.items()],
                           KafkaSettings(bootstrap))
    expected = [*RECORD_COLUMNS, *([HEADERS_COLUMN] if spec.source.include_headers else [])]
    assert records.columns == expected
    types = dict(records.dtypes)
    assert (types["key"], types["value"], types["timestamp"], types["timestamp_type"]) == (
        "binary", "binary", "timestamp", "int")
    if spec.source.include_headers:
        assert types[HEADERS_COLUMN] == "array<struct<key:string,value:binary>>"
    rows = records.select("*", F.unix_millis("timestamp").alias("_ms")).collect()
    return {(row["partition"], row["offset"]): row for row in rows}


def headers_of(row: Any) -> Headers:
    return [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in row[HEADERS_COLUMN] or []]


def as_ledger_json(headers: Headers) -> list[dict[str, Any]] | None:
    """The oracle of the ledger's `headers`: {"key", "value" in base64 or null}, in order; NULL without headers."""
    return [{"key": k, "value": None if v is None else base64.b64encode(v).decode()} for k, v in headers] or None


def test_a_job_sees_each_records_key_value_timestamp_type_and_headers_as_produced(spark, kafka, topic):
    bootstrap = kafka.bootstrap_servers
    now_ms = int(time.time() * 1000)
    sent = [
        Sent(0, b"user-1", b"one", [("trace-id", b"abc"), ("bin", b"\x00\xff\xfe")], now_ms - 60_000),
        Sent(0, None, b"keyless, no headers", [], now_ms - 1),
        Sent(0, b"user-3", None, [("dup", b"1"), ("dup", b"2"), ("empty", b"")]),  # a tombstone
        Sent(1, "clé".encode(), b"", [("ünï", "é".encode())], 1_000),  # 1970, to the millisecond
        Sent(1, b"\x00\xff", b"\xff binary", [("k", b"v")], now_ms),
    ]
    produce(bootstrap, topic, sent)
    oracle = by_offset(topic, sent)
    stamps = broker_timestamps(bootstrap, topic, [0, 1], len(sent))
    assert sorted(stamps) == sorted(oracle)
    ends = {0: 3, 1: 2}

    for include_headers in (True, False):
        read = read_records(spark, make_spec(topic, include_headers), bootstrap, ends)
        assert sorted(read) == sorted(oracle)
        for coordinates, r in oracle.items():
            row = read[coordinates]
            assert row["topic"] == topic
            assert (row["key"], row["value"]) == (r.key, r.value), coordinates
            assert row["timestamp_type"] == CREATE_TIME, coordinates
            assert row["_ms"] == (r.timestamp_ms if r.timestamp_ms is not None else stamps[coordinates][0])
            if include_headers:
                assert headers_of(row) == r.headers, coordinates
                if not r.headers:
                    assert row[HEADERS_COLUMN] is None  # Spark's Kafka source: null, not an empty array


def test_a_topic_with_log_append_time_gives_the_brokers_timestamp_and_type_1(spark, kafka):
    bootstrap = kafka.bootstrap_servers
    name = f"t_{uuid.uuid4().hex[:10]}"
    create_topic(bootstrap, name, 1, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    sent = [Sent(0, b"k", b"v", [("h", b"1")], 1_000), Sent(0, None, b"w", [])]
    produce(bootstrap, name, sent)
    after = int(time.time() * 1000)
    stamps = broker_timestamps(bootstrap, name, [0], len(sent))

    read = read_records(spark, make_spec(name, True), bootstrap, {0: 2})
    for coordinates, r in by_offset(name, sent).items():
        row = read[coordinates]
        assert row["timestamp_type"] == LOG_APPEND_TIME == stamps[coordinates][1]
        assert row["_ms"] == stamps[coordinates][0] and before - 1000 <= row["_ms"] <= after + 1000  # not 1,000
        assert (row["key"], row["value"], headers_of(row)) == (r.key, r.value, r.headers)


def access_line(ip: str, at: datetime) -> bytes:
    return f'{ip} - - [{at.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "GET / HTTP/1.1" 200 5 "-" "t"'.encode()


def test_dead_letters_and_late_records_keep_their_headers(spark, kafka, topic, ledger_url):
    from microbatch.phases.stage import stage_batch

    bootstrap = kafka.bootstrap_servers
    now = datetime.now(UTC).replace(microsecond=0)
    old = datetime.fromtimestamp(now.timestamp() - 3600, UTC)
    spec = make_spec(topic, True)
    sent = [
        Sent(0, b"a", access_line("203.0.113.7", now), [("trace-id", b"t1")]),
        Sent(0, b"b", b"not an access-log line", [("trace-id", b"t2"), ("bin", b"\x00\xff"), ("empty", b"")]),
        Sent(1, None, b"\xff garbage without headers", []),
        Sent(1, b"c", access_line("198.51.100.1", old), [("trace-id", b"late"), ("trace-id", b"again")]),
    ]
    produce(bootstrap, topic, sent)
    oracle = by_offset(topic, sent)
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    # One batch, as if an earlier one had committed a watermark ten minutes ago: the line of an hour ago is late.
    watermark_us = int(now.timestamp() - 600) * 1_000_000
    with transaction(ledger_url) as session:
        session.execute(text("UPDATE pipelines SET state = CAST(:s AS jsonb)"), {"s": json.dumps(
            {"watermark_us": watermark_us, "max_event_time_us": watermark_us + 5_000_000})})
    result = stage_batch(spark, spec, outcome.batch_id, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert result is not None and (result.dead_letters, result.late_records) == (2, 1)
    with transaction(ledger_url) as session:
        commit_batch(session, spec, outcome.batch_id)

    with transaction(ledger_url) as session:
        dead = {(d.partition, d.offset): d for d in session.scalars(select(DeadLetter)).all()}
        late = {(r.partition, r.offset): r for r in session.scalars(select(LateRecord)).all()}
        # What a user would query: one row per header, its value decoded back to bytes.
        flat = session.execute(text(
            "SELECT d.partition, d.\"offset\", h->>'key', decode(h->>'value', 'base64') "
            "FROM dead_letters d, jsonb_array_elements(d.headers) WITH ORDINALITY AS t(h, i) "
            "ORDER BY d.partition, d.\"offset\", i")).all()
    assert sorted(dead) == [(0, 1), (1, 0)] and sorted(late) == [(1, 1)]
    for coordinates, row in [*dead.items(), *late.items()]:
        r = oracle[coordinates]
        assert row.raw == r.value, coordinates
        assert row.headers == as_ledger_json(r.headers), coordinates
    assert [(p, o, k, bytes(v)) for p, o, k, v in flat] == [(0, 1, k, v) for k, v in oracle[(0, 1)].headers]


def test_the_migration_keeps_bad_records_written_at_0013_with_no_headers(postgres: Any) -> None:
    with ledger_at_revision(postgres, "0013", "committed") as (url, conn, pipeline, batch):
        for table in ("dead_letters", "late_records"):
            extra = ("error", "'bad'") if table == "dead_letters" else ("event_time", "now()")
            conn.execute(text(
                f'INSERT INTO {table} (pipeline_id, batch_id, topic, partition, "offset", raw, {extra[0]}) '
                f"VALUES (:p, :b, 'old-topic', 0, 1, 'x', {extra[1]})"), {"p": pipeline, "b": batch})

    assert migrate(url) == "0017"

    with transaction(url) as session:
        (letter,) = session.scalars(select(DeadLetter)).all()
        (record,) = session.scalars(select(LateRecord)).all()
        assert (letter.raw, letter.headers, record.raw, record.headers) == (b"x", None, b"x", None)
