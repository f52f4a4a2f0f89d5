"""`microbatch reset --to timestamp` on a real broker and ledger: each partition moves to its first record at or
after the time (Kafka's offsets-for-times), a partition with no such record to its latest offset."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kafka import KafkaProducer
from sqlalchemy import text

from microbatch.ledger.database import transaction
from tests.e2e.helpers import cli, write_test_spec

pytestmark = pytest.mark.integration


def test_reset_to_a_time_moves_each_partition_to_its_first_record_at_or_after_it(
    service_env, topic, kafka, ledger_url, tmp_path
):
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(write_test_spec(tmp_path / "pipelines", topic, 20,
                                                                                  bootstrap=kafka.bootstrap_servers))}
    base = 1_790_000_000_000
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    for i in range(6):
        producer.send(topic, value=b"x", partition=0, timestamp_ms=base + i * 1000)
    for i in range(3):
        producer.send(topic, value=b"x", partition=1, timestamp_ms=base - 10_000 + i)  # all before the time
    producer.flush()
    producer.close()
    at = datetime.fromtimestamp((base + 2500) / 1000, tz=UTC).isoformat().replace("+00:00", "Z")

    moved = cli(env, "reset", "ip_count", "--to", "timestamp", "--value", at, "--yes")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    with transaction(ledger_url) as session:
        positions = dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())
        targets = session.execute(text("SELECT DISTINCT target FROM position_resets")).scalars().all()
    assert positions == {0: 3, 1: 3, 2: 0, 3: 0}
    assert targets == ["timestamp"]
