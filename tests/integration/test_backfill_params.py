"""Bad backfill parameters on a real broker and ledger: each is refused with one sentence naming the
parameter, and nothing is written; a backfill overlapping an open batch waits for it (or for
`microbatch abandon`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kafka import KafkaProducer
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.errors import SpecError
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, transaction
from microbatch.phases.backfill import plan_backfill
from microbatch.phases.commit import commit_batch
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from tests.e2e.helpers import cli, write_test_spec

pytestmark = pytest.mark.integration


def written(url: str) -> tuple[int, int]:
    with transaction(url) as session:
        return (session.execute(text("SELECT count(*) FROM batches")).scalar_one(),
                session.execute(text("SELECT count(*) FROM ranges")).scalar_one())


def test_bad_parameters_are_refused_before_anything_is_written(service_env, topic, kafka, ledger_url, tmp_path,
                                                               monkeypatch):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=1_000, bootstrap=kafka.bootstrap_servers)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    for partition in range(4):
        for i in range(30):
            producer.send(topic, value=f"line {i}".encode(), partition=partition)
    producer.flush()
    producer.close()
    spec = find_spec("ip_count")
    bootstrap = kafka.bootstrap_servers

    def refused(match: str, **params: object) -> None:
        with pytest.raises(SpecError, match=match) as caught:
            plan_backfill(spec, {"topic": topic, **params}, Ledger(ledger_url), KafkaSettings(bootstrap))
        assert "\n" not in caught.value.message
        assert written(ledger_url) == (0, 0)

    refused("Backfill parameter 'end': must be greater than start", start=10, end=10)
    refused("Backfill parameter 'start': an offset is at least 0", start=-1, end=5)
    refused(rf"Backfill parameter 'end': 31 is beyond the latest offset of {topic}\[0\] \(30\)", start=0, end=31)
    refused(rf"Backfill parameter 'partitions': {topic}\[7\] does not exist", start=0, end=5, partitions=[7])
    with pytest.raises(SpecError, match="Backfill parameter 'topic': 'elsewhere' is not a topic"):
        plan_backfill(spec, {"topic": "elsewhere", "start": 0, "end": 5}, Ledger(ledger_url), KafkaSettings(bootstrap))
    refused("Backfill parameter 'start': no record of .* has a timestamp at or after",
            start=datetime(2100, 1, 1, tzinfo=UTC).isoformat(), end="latest")
    refused(rf"Backfill mode 'replay': {topic}\[0\] \[0, 30\) was never committed", start=0, end="latest",
            partitions=[0], mode="replay")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.delete_records({KTP(topic, 1): 12})
    admin.close()
    refused(rf"Backfill range {topic}\[1\] \[0, 30\) starts before the earliest offset Kafka still holds \(12\)",
            start=0, end="latest", partitions=[1])

    # An open scheduled batch: a replay of its offsets is refused until it ends, or until it is abandoned.
    first = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    with transaction(ledger_url) as session:
        attempt = repo.begin_attempt(session, first.batch_id)
        ranges = repo.batch_ranges(session, first.batch_id)
    with transaction(ledger_url) as session:
        repo.record_staged(session, first.batch_id, attempt, {"rows_by_sink": {}}, {}, {})
    with transaction(ledger_url) as session:
        commit_batch(session, spec, first.batch_id)
    outcome = plan_backfill(spec, {"topic": topic, "start": 0, "end": "latest", "partitions": [0], "mode": "replay"},
                            Ledger(ledger_url), KafkaSettings(bootstrap))
    [replay_id] = outcome.batch_ids
    assert [c.range for c in outcome.replay.replace] == [r for r in ranges if r.partition == 0]
    with pytest.raises(SpecError, match=f"overlaps batch {replay_id}, which is still planned") as caught:
        plan_backfill(spec, {"topic": topic, "start": 5, "end": 6, "partitions": [0], "mode": "replay"},
                      Ledger(ledger_url), KafkaSettings(bootstrap))
    assert f"microbatch abandon ip_count {replay_id}" in caught.value.fix
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    abandoned = cli(env, "abandon", "ip_count", str(replay_id), "--yes")
    assert abandoned.returncode == 0, abandoned.stdout + abandoned.stderr
    again = plan_backfill(spec, {"topic": topic, "start": 5, "end": 6, "partitions": [0], "mode": "replay"},
                          Ledger(ledger_url), KafkaSettings(bootstrap))
    assert len(again.batch_ids) == 1 and again.replay.widened
    assert cli(env, "abandon", "ip_count", str(replay_id), "--yes").returncode != 0, "not open any more"
