"""Change data capture for the tests (tests/conftest.py loads this module as a plugin): `cdc_source`, a PostgreSQL with
logical decoding, and `cdc`, a Kafka Connect worker with Debezium's PostgreSQL connector against the session's `kafka`,
both once per test module; `cdc.register(table)` captures a table into a topic of its own.

Nothing is mocked: the worker is the Apache Kafka 4.1 `ConnectStandalone` and Debezium 3.6's connector from Maven
Central (`make jars`). A test may kill and restart the worker (`cdc.worker.restart(hard=True)`): the connectors it had
come back from their files and carry on from the offsets it flushed (Debezium may send some events again).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from microbatch.dev.cdc import KafkaConnectWorker, source_postgres, topic_name, wait_for_topic
from microbatch.dev.postgres import DATABASE, LocalPostgres

ORDERS_TABLE = """
CREATE TABLE public.orders (
    region text NOT NULL,
    order_id bigint NOT NULL,
    amount numeric(12, 2) NOT NULL,
    placed_at timestamptz NOT NULL,
    note text,
    description text NOT NULL,
    PRIMARY KEY (region, order_id)
)"""
"""The CDC tests' source table: a composite primary key, a numeric(12,2), a timestamptz, a nullable text and a large
text (TOASTed when a row's value is long)."""


@dataclass(frozen=True)
class Change:
    """One record of a table's topic: its offset, and its key and value as JSON (a tombstone's value is None)."""

    offset: int
    key: dict[str, Any] | None
    value: dict[str, Any] | None

    @property
    def payload(self) -> dict[str, Any] | None:
        """The value's payload (the value itself when the converter writes no schemas); None for a tombstone."""
        if self.value is None:
            return None
        return self.value["payload"] if "payload" in self.value and "schema" in self.value else self.value

    @property
    def op(self) -> str | None:
        """Debezium's op: r (snapshot read), c, u, d; None for a tombstone."""
        return self.payload["op"] if self.payload else None


@dataclass
class Cdc:
    """The source database, the worker, and the broker they write to, for one test module."""

    source: LocalPostgres
    worker: KafkaConnectWorker
    bootstrap_servers: str

    def sql(self, statement: str, params: tuple | None = None) -> list[tuple]:
        """Run one statement on the source database (autocommit); its rows, if it returns any."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.source.port, user=self.source.user,
                             password=self.source.password, dbname=DATABASE, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def register(self, table: str, prefix: str | None = None, name: str | None = None, timeout: float = 60,
                 **options: Any) -> str:
        """Capture `table` (`schema.table`) with a new connector (a new prefix, slot and publication unless given),
        wait until it runs and its topic exists; return the topic."""
        prefix = prefix or f"cdc{uuid.uuid4().hex[:8]}"
        name = name or f"{prefix}-connector"
        self.worker.register_postgres(self.source, name=name, tables=[table], topic_prefix=prefix, timeout=timeout,
                                      **options)
        topic = topic_name(prefix, table)
        wait_for_topic(self.bootstrap_servers, topic, timeout)
        return topic

    def changes(self, topic: str, count: int, timeout: float = 30, until: Any = None) -> list[Change]:
        """The topic's records from its start (one partition) once there are at least `count` of them (and, with
        `until`, once `until(changes)` holds), within `timeout` seconds."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                 auto_offset_reset="earliest")
        try:
            partition = TopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek_to_beginning(partition)
            found: list[Change] = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    found.extend(Change(r.offset, json.loads(r.key) if r.key else None,
                                        json.loads(r.value) if r.value is not None else None) for r in records)
                if len(found) >= count and (until is None or until(found)):
                    return found
            raise AssertionError(f"{len(found)} records on {topic} after {timeout}s, expected {count}: "
                                 f"{[(c.offset, c.op) for c in found]}; see {self.worker.log_file}")
        finally:
            consumer.close()


@pytest.fixture(scope="module")
def cdc_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """A PostgreSQL with logical decoding (wal_level=logical) for one test module, its data discarded after it."""
    folder = tmp_path_factory.mktemp("cdc-source")
    server = source_postgres(folder / "postgres")
    try:
        server.start()
        server.create_database(DATABASE)
        yield server
    finally:
        server.stop()
        _discard(folder)


@pytest.fixture(scope="module")
def cdc(cdc_source: LocalPostgres, kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cdc]:
    """A Kafka Connect worker with Debezium against the session's broker, for one test module; stopped after it."""
    worker = KafkaConnectWorker(tmp_path_factory.mktemp("cdc-connect"), kafka.bootstrap_servers)
    try:
        worker.start()
        yield Cdc(cdc_source, worker, kafka.bootstrap_servers)
    finally:
        worker.stop()


def _discard(folder: Path) -> None:
    """As tests/conftest.py does with the suite's PostgreSQL: the folder, then (as root) its data under /var/tmp."""
    shutil.rmtree(folder, ignore_errors=True)
    if os.geteuid() == 0:
        from microbatch.dev.postgres_root import prune

        prune()
