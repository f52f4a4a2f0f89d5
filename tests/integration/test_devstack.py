"""The local stack itself: a real KRaft broker and a real PostgreSQL start, serve, survive a hard
restart with their data, and stop, leaving their ports closed."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from sqlalchemy import create_engine, text

from microbatch.dev.kafka import KafkaBroker, create_topic
from microbatch.dev.postgres import LocalPostgres
from microbatch.dev.process import port_open, wait_until

pytestmark = pytest.mark.integration


def _consume_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, bytes]]:
    """Every record of `topic`, read until each partition's position reaches its end offset (not an idle wait)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                             isolation_level="read_committed", consumer_timeout_ms=60_000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        records, deadline = [], time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"not all of {ends} read in 60 s"
            for batch in consumer.poll(timeout_ms=1000).values():
                records += [(m.partition, m.value) for m in batch]
        return sorted(records)
    finally:
        consumer.close()


def test_kafka_broker_serves_and_survives_a_hard_restart(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka")
    with broker:
        port = broker.port
        create_topic(broker.bootstrap_servers, "devstack", 4)
        create_topic(broker.bootstrap_servers, "devstack", 4)  # idempotent
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
        for i in range(10):
            producer.send("devstack", value=f"r{i}".encode(), partition=i % 4)
        producer.flush()
        producer.close()
        records = _consume_all(broker.bootstrap_servers, "devstack", 4)
        assert sorted(v for _, v in records) == sorted(f"r{i}".encode() for i in range(10))
        assert {p for p, _ in records} == {0, 1, 2, 3}

        pid = broker.pid
        broker.restart(hard=True)
        assert broker.port == port and broker.pid != pid
        assert _consume_all(broker.bootstrap_servers, "devstack", 4) == records
        assert (tmp_path / "kafka" / "broker.log").stat().st_size > 0, "the broker must log to its file"
    assert not port_open(port)
    assert not port_open(broker.controller_port)


def test_postgres_has_btree_gist_and_a_password_user(tmp_path: Path) -> None:
    server = LocalPostgres(tmp_path / "postgres")
    with server:
        server.create_database("devstack")
        server.create_database("devstack")  # idempotent
        url = server.url("devstack")
        assert url.startswith(f"postgresql+psycopg://{server.user}:") and f":{server.port}/devstack" in url
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS btree_gist"))
            conn.execute(text("CREATE TABLE spans (k int, r int4range, EXCLUDE USING gist (k WITH =, r WITH &&))"))
            conn.execute(text("INSERT INTO spans VALUES (1, '[0,10)'), (1, '[10,20)'), (2, '[0,10)')"))
            assert conn.execute(text("SELECT count(*) FROM spans")).scalar_one() == 3
        with pytest.raises(Exception, match="conflicting key value"), engine.begin() as conn:
            conn.execute(text("INSERT INTO spans VALUES (1, '[5,15)')"))
        engine.dispose()
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host="127.0.0.1", port=server.port, user=server.user, password="wrong",
                            dbname="devstack").close()

        server.restart(hard=True)
        engine = create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM spans")).scalar_one() == 3
        engine.dispose()
    assert not port_open(server.port)


FAKE_AIRFLOW = """import os, sys
from microbatch.dev.stack import record_airflow
record_airflow()  # as `make airflow` does before it execs the standalone (same pid)
os.execv(sys.executable, [sys.executable, sys.argv[1], "standalone"])
"""


def test_devstack_services_then_connect_reuses_airflow_down_stops_airflow_alone_and_down_stops_all(
        tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from microbatch.runtime import cache_dir

    # A cache of its own (the jars linked from the real one), so the operator's stack is not touched.
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("jars", "m2"):
        (cache / name).symlink_to(cache_dir() / name)
    env = {**os.environ, "MICROBATCH_CACHE_DIR": str(cache)}

    def devstack(command: str) -> str:
        return subprocess.run([sys.executable, "-m", "microbatch.dev.stack", command], env=env, capture_output=True,
                              text=True, timeout=300, check=True).stdout

    try:
        first = devstack("services")  # `make up`: Kafka, PostgreSQL and the Spark Connect server, nothing else
        state = json.loads((cache / "devstack" / "state.json").read_text())
        assert f"local stack up: Kafka 127.0.0.1:{state['kafka_port']}" in first
        assert port_open(state["kafka_port"]) and port_open(state["postgres_port"])
        # The server requires the stack's token: in the remote that env.sh exports, never in what is printed.
        token = state["connect_token"]
        remote = f"sc://localhost:{state['connect_port']}/;token={token}"
        assert f"up on sc://localhost:{state['connect_port']}, token required" in first and token not in first
        assert f"source {cache / 'devstack' / 'env.sh'}" in first
        assert state["env"]["MICROBATCH_SPARK_REMOTE"] == remote
        assert f"export MICROBATCH_SPARK_REMOTE='{remote}'" in (cache / "devstack" / "env.sh").read_text()
        assert port_open(state["connect_port"])
        again = devstack("connect")  # the live server is reused, not started twice
        assert f"already up on sc://localhost:{state['connect_port']} (pid {state['connect_pid']})" in again
        assert token not in again
        # `make airflow-down`: the recorded standalone (here a stand-in named airflow) and nothing else.
        (tmp_path / "airflow").write_text("import time\ntime.sleep(300)\n")
        (tmp_path / "record.py").write_text(FAKE_AIRFLOW)
        standalone = subprocess.Popen([sys.executable, str(tmp_path / "record.py"), str(tmp_path / "airflow")],
                                      env={**env, "AIRFLOW_HOME": str(tmp_path / "airflow_home")},
                                      start_new_session=True)
        wait_until(lambda: b"airflow\0standalone" in Path(f"/proc/{standalone.pid}/cmdline").read_bytes(), 30,
                   "the stand-in standalone")
        assert "airflow standalone stopped (1 processes); the services keep running" in devstack("airflow-down")
        assert standalone.wait(10) is not None
        after_airflow = json.loads((cache / "devstack" / "state.json").read_text())
        assert "airflow_pid" not in after_airflow
        assert all(port_open(after_airflow[key]) for key in ("kafka_port", "postgres_port", "connect_port"))
        # `make cdc`: a source PostgreSQL and a Debezium worker on the same Kafka, recorded for `down`; the source's
        # password is in no line it prints.
        cdc = devstack("cdc")
        state = json.loads((cache / "devstack" / "state.json").read_text())
        worker = f"Kafka Connect worker http://127.0.0.1:{state['cdc_worker_port']} (pid {state['cdc_worker_pid']})"
        assert worker in cdc
        assert f"topic cdc.public.orders on 127.0.0.1:{state['kafka_port']}" in cdc and "RUNNING" in cdc
        password = (cache / "devstack" / "cdc" / "postgres" / "password").read_text().strip()
        assert password not in cdc
        assert password not in (cache / "devstack" / "cdc" / "connect" / "connect.log").read_text()
        assert f"(pid {state['cdc_worker_pid']})" in devstack("cdc")  # the live worker is reused
        # The tutorial's statement on the source (docs/your-own-pipeline.md): the sample table's four rows.
        counted = subprocess.run([sys.executable, "-m", "microbatch.dev.cdc_stack", "SELECT count(*) FROM orders"],
                                 env=env, capture_output=True, text=True, timeout=60, check=True)
        assert counted.stdout == "4\n" and not counted.stderr, counted
    finally:
        devstack("down")
    assert not port_open(state["kafka_port"]) and not port_open(state["postgres_port"])
    assert not port_open(state["connect_port"]) and not port_open(state["cdc_worker_port"])
    assert not port_open(state["cdc_source_port"])
    assert _gone(state["connect_pid"]) and _gone(state["cdc_worker_pid"])
    after = json.loads((cache / "devstack" / "state.json").read_text())
    assert "connect_pid" not in after and "cdc_worker_pid" not in after
    assert "MICROBATCH_SPARK_REMOTE" not in after["env"]


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie not yet reaped by init counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
