"""The pipeline on a Kafka cluster that requires a SASL login: the planner, Spark's Kafka source and the
transactional publisher all authenticate with the same settings, a wrong password fails with one
clear sentence and writes nothing, and the Kafka password appears in no process's arguments and in no
log."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from kafka import KafkaProducer
from sqlalchemy import text

from microbatch.dev.datagen import format_line
from microbatch.dev.kafka import KafkaBroker, create_topic
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    positions,
    read_topic,
    run_log,
    run_pipeline,
    run_watching_arguments,
    sink_counts,
    verify_ledger,
    write_test_spec,
)

pytestmark = pytest.mark.e2e
T0 = datetime(2026, 11, 22, 15, 0, 0, tzinfo=UTC)
PASSWORD = "etl-s3cret-Kafka"


@pytest.fixture
def sasl_broker(tmp_path):
    broker = KafkaBroker(tmp_path / "kafka-sasl", sasl_users={"etl": PASSWORD})
    broker.start()
    yield broker
    broker.stop()


def security_env(password: str) -> dict[str, str]:
    return {
        "MICROBATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "MICROBATCH_KAFKA_SASL_MECHANISM": "PLAIN",
        "MICROBATCH_KAFKA_SASL_USERNAME": "etl",
        "MICROBATCH_KAFKA_SASL_PASSWORD": password,
    }


def test_pipeline_on_a_sasl_cluster(sasl_broker, ledger_url, tmp_path):
    topic = "sasl_source"
    create_topic(sasl_broker.bootstrap_servers, topic, 4)
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=800, bootstrap=sasl_broker.bootstrap_servers,
                            spark_mode="submit")
    producer = KafkaProducer(bootstrap_servers=sasl_broker.bootstrap_servers, acks="all")
    ips = [f"10.2.0.{i % 9}" for i in range(800)]
    futures = [producer.send(topic, value=format_line(ip, T0 + timedelta(seconds=i // 20)), partition=i % 4)
               for i, ip in enumerate(ips)]
    producer.flush()
    ends: dict[int, int] = {}
    for future in futures:
        meta = future.get(timeout=30)
        ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    producer.close()
    env = {"MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_KAFKA_BOOTSTRAP": sasl_broker.sasl_bootstrap_servers,
           "MICROBATCH_PIPELINES_DIR": str(specs)}

    # A wrong password: the run fails, says why, and nothing is planned or written.
    started = time.monotonic()
    refused = run_pipeline({**env, **security_env("wrong-password")}, max_runs=1, timeout=600)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "SASL" in output and "etl" in output, output[-3000:]
    assert "wrong-password" not in run_log(refused)
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == 0
    print(f"refused in {time.monotonic() - started:.1f}s")

    # The right password: every client logs in; the password is in no process's arguments.
    run = run_watching_arguments({**env, **security_env(PASSWORD)}, [PASSWORD], tmp_path / "run.log", max_runs=6)
    assert run.returncode == 0, run.log[-3000:]
    assert run.spark_seen and not run.leaked, run.leaked
    assert PASSWORD not in run.log

    assert positions(ledger_url) == ends
    by_ip: Counter = Counter()
    for (_, ip), n in sink_counts(ledger_url).items():
        by_ip[ip] += n
    assert by_ip == Counter(ips)
    assert verify_ledger({**env, **security_env(PASSWORD)})["ok"]

    # The publisher wrote the final windows through the SASL listener, in committed transactions.
    with transaction(ledger_url) as session:
        outbox = session.execute(text("SELECT count(*) FROM outbox")).scalar_one()
    assert outbox > 0
    published = len(read_topic(sasl_broker.sasl_bootstrap_servers, f"{topic}_out", security_protocol="SASL_PLAINTEXT",
                               sasl_mechanism="PLAIN", sasl_plain_username="etl", sasl_plain_password=PASSWORD))
    assert published == outbox
