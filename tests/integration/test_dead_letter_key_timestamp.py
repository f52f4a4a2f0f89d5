"""Dead letters keep their Kafka record's key and timestamp (migration 0013), on a real PostgreSQL and broker.

The migration is applied to a ledger at 0012 that already holds dead letters: they keep working, with NULL key
and timestamp. Then one batch of keyed records, some malformed, is staged by the real stage on the in-process
Spark and committed: each dead letter's key and timestamp are those kafka-python reads back for its offset."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from sqlalchemy import select, text

from microbatch.config import PIPELINES_DIR, PipelineSpec
from microbatch.ledger import queries
from microbatch.ledger.database import Ledger, transaction
from microbatch.ledger.models import DeadLetter
from microbatch.phases.commit import commit_batch
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from microbatch.sinks.schema import migrate
from tests.integration.conftest import ledger_at_revision

pytestmark = pytest.mark.integration


def test_the_migration_keeps_dead_letters_written_at_0012_with_no_key_or_timestamp(postgres: Any) -> None:
    with ledger_at_revision(postgres, "0012", "staged") as (url, conn, pipeline, batch):
        conn.execute(text(
            'INSERT INTO dead_letters (pipeline_id, batch_id, topic, partition, "offset", raw, error) '
            "VALUES (:p, :b, 'old-topic', 2, 7, 'not a line', 'not an access-log line')"),
            {"p": pipeline, "b": batch})
        conn.execute(text(
            'INSERT INTO stage_dead_letters (batch_id, attempt, topic, partition, "offset", raw, error) '
            "VALUES (:b, 1, 'old-topic', 2, 8, 'staged', 'staged before the upgrade')"), {"b": batch})

    assert migrate(url) == "0017"

    with transaction(url) as session:
        (old,) = session.scalars(select(DeadLetter)).all()
        assert (old.topic, old.partition, old.offset, old.raw, old.error) == (
            "old-topic", 2, 7, b"not a line", "not an access-log line")
        assert (old.key, old.timestamp) == (None, None)
        staged = session.execute(text(
            'SELECT "offset", "key", "timestamp" FROM stage_dead_letters')).all()
        assert [tuple(row) for row in staged] == [(8, None, None)]
        assert queries.sink_view(session, pipeline, "ip_counts", ["window_start"], [], 5).dead_letters == 1


def make_spec(topic: str) -> PipelineSpec:
    data = yaml.safe_load((PIPELINES_DIR / "ip_count.yaml").read_text())
    data["source"] = {k: v for k, v in data["source"].items() if k != "topics"} | {"topics": [topic]}
    return PipelineSpec.model_validate(data)


def access_line(ip: str, at: datetime) -> bytes:
    return f'{ip} - - [{at.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "GET / HTTP/1.1" 200 5 "-" "t"'.encode()


def read_back(bootstrap: str, topic: str, partitions: list[int], count: int) -> dict[tuple[int, int], Any]:
    """Every record of `partitions` as kafka-python reads it, by (partition, offset): the independent oracle."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        consumer.assign([KTP(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        return {(r.partition, r.offset): r for _, r in zip(range(count), consumer, strict=False)}
    finally:
        consumer.close()


def test_a_staged_and_committed_dead_letter_keeps_its_records_key_and_timestamp(spark, kafka, topic, ledger_url):
    from microbatch.phases.stage import stage_batch

    bootstrap = kafka.bootstrap_servers
    now = datetime.now(UTC).replace(microsecond=0)
    created = int(now.timestamp() * 1000) - 1234  # an explicit CreateTime for one of them, to the millisecond
    # (partition, key, value, timestamp_ms): keyed good lines, and malformed records with a UTF-8 key, a key that
    # is not UTF-8, no key at all, and an explicit timestamp.
    sent = [
        (0, b"user-1", access_line("203.0.113.7", now), None),
        (0, "clé-2".encode(), b"no client address here", None),
        (0, b"user-3", access_line("198.51.100.1", now), None),
        (1, b"\x00\xff\xfe", b"\xff binary garbage", None),
        (1, None, b"keyless and malformed", None),
        (1, b"user-6", access_line("999.1.1.1", now), created),  # not an address: a dead letter too
        (1, b"user-7", access_line("2001:db8::1", now), None),
    ]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for partition, key, value, ts in sent:
            producer.send(topic, key=key, value=value, partition=partition, timestamp_ms=ts)
        producer.flush()
    finally:
        producer.close()
    oracle = read_back(bootstrap, topic, [0, 1], len(sent))
    assert len(oracle) == len(sent)
    malformed = {(p, o): r for (p, o), r in oracle.items() if b"GET /" not in r.value or r.value.startswith(b"999.")}
    assert sorted(malformed) == [(0, 1), (1, 0), (1, 1), (1, 2)]
    assert malformed[(1, 2)].timestamp == created

    spec = make_spec(topic)
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    result = stage_batch(spark, spec, outcome.batch_id, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert result is not None and result.dead_letters == 4
    with transaction(ledger_url) as session:
        staged = session.execute(text(
            'SELECT partition, "offset", "key", "timestamp" FROM stage_dead_letters')).all()
        assert len(staged) == 4 and all(row.timestamp is not None for row in staged)
    with transaction(ledger_url) as session:
        assert commit_batch(session, spec, outcome.batch_id).dead_letters == 4

    with transaction(ledger_url) as session:
        dead = {(d.partition, d.offset): d for d in session.scalars(
            select(DeadLetter).where(DeadLetter.topic == topic)).all()}
        assert session.execute(text("SELECT count(*) FROM stage_dead_letters")).scalar_one() == 0
    assert sorted(dead) == sorted(malformed)
    for coordinates, record in malformed.items():
        row = dead[coordinates]
        assert (row.key, row.raw) == (record.key, record.value), coordinates
        assert row.timestamp == datetime.fromtimestamp(record.timestamp / 1000, UTC), coordinates
        assert row.headers is None, coordinates  # source.include_headers is off
    assert dead[(1, 1)].key is None
