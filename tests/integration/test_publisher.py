"""The transactional publisher on a real broker and Postgres: bounded transactions, crashes at
each point (real process deaths), a fenced zombie, no hanging transaction, and aborted records
that read_committed never sees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.dev.kafka import create_topic
from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, publish_lock, transaction
from microbatch.phases.publish import publish_sink
from microbatch.settings import KafkaSettings
from microbatch.sinks.kafka_publish import last_published_seq
from microbatch.types import OffsetRange, Plan
from tests.e2e.helpers import read_output, read_topic, write_test_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def outbox(ledger_url, topic, kafka, tmp_path, monkeypatch):
    """A test spec publishing to `<topic>_out`, and 1,200 outbox rows committed for it."""
    specs = write_test_spec(tmp_path / "pipelines", topic, 1000, bootstrap=kafka.bootstrap_servers)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    spec = find_spec("ip_count")
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, spec)
        batch = repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange(topic, 0, 0, 1),)))
        session.execute(
            text("INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) "
                 "SELECT :p, 'ip_count_sink', g, :b, '10.0.0.' || (g % 7), "
                 "jsonb_build_object('ip', '10.0.0.' || (g % 7), 'window_start', g, 'count', g) "
                 "FROM generate_series(1, 1200) AS g"),
            {"p": pipeline.id, "b": batch.id},
        )
    return spec, f"{topic}_out"


def publish_in_subprocess(env: dict[str, str], failpoint: str | None, markers) -> subprocess.CompletedProcess:
    extra = {FAILPOINTS_ENV: failpoint, FAILPOINT_DIR_ENV: str(markers)} if failpoint else {}
    return subprocess.run([sys.executable, "-m", "microbatch.cli", "publish", "ip_count"],
                          env={**os.environ, **env, **extra}, capture_output=True, text=True, timeout=180,
                          check=False)


def assert_published_once(bootstrap: str, topic: str, count: int) -> None:
    seqs = sorted(seq for seq, _ in read_output(bootstrap, topic))
    assert seqs == list(range(1, count + 1))


def test_publishes_in_bounded_transactions_and_resumes_from_the_topic(outbox, ledger_url, kafka):
    spec, topic = outbox
    sink = next(s for s in spec.sinks if s.type == "kafka")
    result = publish_sink(spec, sink, Ledger(ledger_url), KafkaSettings(kafka.bootstrap_servers))
    assert (result.first_seq, result.last_seq, result.records, result.transactions) == (1, 1200, 1200, 3)
    assert_published_once(kafka.bootstrap_servers, topic, 1200)
    assert last_published_seq(KafkaSettings(kafka.bootstrap_servers), topic) == 1200
    again = publish_sink(spec, sink, Ledger(ledger_url), KafkaSettings(kafka.bootstrap_servers))
    assert again.records == 0
    # Even with the progress record lost, the topic's committed tail says what was published.
    with transaction(ledger_url) as session:
        session.execute(text("DELETE FROM publish_progress"))
    again = publish_sink(spec, sink, Ledger(ledger_url), KafkaSettings(kafka.bootstrap_servers))
    assert again.records == 0 and again.resumed_after == 1200
    assert_published_once(kafka.bootstrap_servers, topic, 1200)


@pytest.mark.parametrize("failpoint", ["publish.before_commit", "publish.after_commit",
                                       "publish.between_transactions", "publish.before_commit=kill"])
def test_publisher_killed_at_each_point_publishes_each_sequence_once(failpoint, outbox, service_env, kafka,
                                                                     tmp_path):
    _, topic = outbox
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": os.environ["MICROBATCH_PIPELINES_DIR"]}
    crashed = publish_in_subprocess(env, failpoint, tmp_path / "fired")
    assert crashed.returncode in (EXIT_CODE, -9), crashed.stdout + crashed.stderr
    recovered = publish_in_subprocess(env, failpoint, tmp_path / "fired")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert_published_once(kafka.bootstrap_servers, topic, 1200)


def test_zombie_publisher_is_fenced_and_its_records_stay_invisible(outbox, ledger_url, kafka):
    spec, topic = outbox
    sink = next(s for s in spec.sinks if s.type == "kafka")
    zombie = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=sink.transactional_id)
    zombie.init_transactions()
    zombie.begin_transaction()
    for i in range(5):
        zombie.send(topic, key=b"zombie", value=b'{"zombie": true}',
                    headers=[("microbatch.seq", str(9000 + i).encode())])
    zombie.flush()
    # The real publisher starts with the same transactional id: it fences the zombie and aborts its transaction.
    result = publish_sink(spec, sink, Ledger(ledger_url), KafkaSettings(kafka.bootstrap_servers))
    assert result.records == 1200
    with pytest.raises(KafkaError):
        zombie.commit_transaction()
    zombie.close(timeout=5)
    assert_published_once(kafka.bootstrap_servers, topic, 1200)
    # read_uncommitted may see the zombie's aborted records; read_committed never does.
    dirty = [m for m in read_topic(kafka.bootstrap_servers, topic, "read_uncommitted") if m.key == b"zombie"]
    assert len(dirty) == 5
    assert all(v.get("zombie") is None for _, v in read_output(kafka.bootstrap_servers, topic))


def test_no_hanging_transaction_marker_probe(outbox, ledger_url, kafka):
    spec, topic = outbox
    publish_sink(spec, next(s for s in spec.sinks if s.type == "kafka"), Ledger(ledger_url),
                 KafkaSettings(kafka.bootstrap_servers))
    probe = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"probe-{uuid.uuid4()}")
    probe.init_transactions()
    probe.begin_transaction()
    marker = uuid.uuid4().hex.encode()
    partitions = sorted(probe.partitions_for(topic))
    for partition in partitions:
        probe.send(topic, value=marker, partition=partition)
    probe.commit_transaction()
    probe.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, isolation_level="read_committed",
                             group_id=None)
    consumer.assign([TopicPartition(topic, p) for p in partitions])
    consumer.seek_to_beginning()
    seen: set[int] = set()
    deadline = time.monotonic() + 20
    while len(seen) < len(partitions) and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            seen.update(tp.partition for r in records if r.value == marker)
    consumer.close()
    assert seen == set(partitions), "a hanging transaction keeps the marker invisible"


def test_missing_output_topic_is_a_clear_error(ledger_url, kafka, topic, tmp_path, monkeypatch):
    specs = write_test_spec(tmp_path / "pipelines", topic, 1000)  # no output topic created
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    spec = find_spec("ip_count")
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, spec)
        batch = repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange(topic, 0, 0, 1),)))
        session.execute(text("INSERT INTO outbox VALUES (:p, 'ip_count_sink', 1, :b, 'k', '{}')"),
                        {"p": pipeline.id, "b": batch.id})
    with pytest.raises(Exception, match=f"The output topic '{topic}_out' does not exist"):
        publish_sink(spec, next(s for s in spec.sinks if s.type == "kafka"), Ledger(ledger_url),
                     KafkaSettings(kafka.bootstrap_servers))
    create_topic(kafka.bootstrap_servers, f"{topic}_out", 1)


def test_concurrent_publishers_of_a_sink_wait_for_each_other_instead_of_fencing(outbox, ledger_url, service_env,
                                                                                 kafka, tmp_path):
    """Two live publishers of one sink share its transactional id: without the publish lock the fenced one
    blocked for two minutes and failed. Both now wait for the holder, then one publishes and one finds
    nothing left."""
    spec, topic = outbox
    env = {**os.environ, **service_env, "MICROBATCH_PIPELINES_DIR": os.environ["MICROBATCH_PIPELINES_DIR"]}
    with transaction(ledger_url) as session:
        pipeline_id = repo.get_pipeline(session, spec.name).id
    logs = [tmp_path / f"publisher{i}.log" for i in range(2)]
    with publish_lock(ledger_url, pipeline_id, "ip_count_sink"):  # a live publisher holds the sink
        runs = [subprocess.Popen([sys.executable, "-m", "microbatch.cli", "publish", "ip_count"], env=env,
                                 stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs]
        deadline = time.monotonic() + 120
        while not all("still being published" in log.read_text() for log in logs):
            assert all(run.poll() is None for run in runs), [log.read_text()[-2000:] for log in logs]
            assert time.monotonic() < deadline, "the publishers never reported waiting for the lock"
            time.sleep(0.5)
        assert last_published_seq(KafkaSettings(kafka.bootstrap_servers), topic) == 0
    codes = [run.wait(timeout=120) for run in runs]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    assert_published_once(kafka.bootstrap_servers, topic, 1200)
