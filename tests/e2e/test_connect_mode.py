"""The stage task in `spark.mode: connect`: Airflow dag.test() stages each batch as a client of one
long-lived Spark Connect server (the suite's shared one, with a token), over real Kafka and PostgreSQL; the
sink, the dead letters and the ledger are checked against an independent recount of the input."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import make_url, text

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.dev.spark import SparkConnectServer
from microbatch.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV, release
from microbatch.ledger.database import transaction
from microbatch.runtime import cache_dir
from microbatch.spark_remote import SHARED_SESSION_SECONDS, display
from tests.e2e.helpers import assert_exactly_once, run_log, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e


@pytest.fixture
def connect_server(spark_connect):
    """The suite's shared, token-protected Spark Connect server (tests/conftest.py)."""
    return spark_connect


def connect_spec(directory: Path, topic: str, bootstrap: str, max_records: int, batches_per_run: int = 1) -> Path:
    """The test copy of ip_count in connect mode (only the spark.sql.* settings a session may change)."""
    write_test_spec(directory, topic, max_records, bootstrap=bootstrap, batches_per_run=batches_per_run)
    path = directory / "ip_count.yaml"
    spec = yaml.safe_load(path.read_text())
    conf = {key: value for key, value in spec["spark"]["conf"].items() if key.startswith("spark.sql.")}
    spec["spark"] = {"mode": "connect", "conf": conf}
    path.write_text(yaml.safe_dump(spec))
    return directory


def connect_env(service_env: dict[str, str], specs: Path, server: SparkConnectServer) -> dict[str, str]:
    """The run's environment: the test specs, and the server in MICROBATCH_SPARK_REMOTE (with its token), as the
    local stack's env.sh sets it."""
    assert service_env["MICROBATCH_SPARK_REMOTE"] == server.remote
    return {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}


def run_exactly_once(env: dict[str, str], ledger_url: str, lines: list, coords: list, topic: str) -> str:
    """`microbatch run ip_count` until caught up; it succeeds, and sink, dead letters, ledger and the published
    output match the independent recount. Returns the run's log (its output and its log file)."""
    result = run_pipeline(env, timeout=600)
    log = run_log(result)
    assert result.returncode == 0, log[-4000:]
    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
    return log


def in_one_session_window(seconds: float) -> None:
    """Wait, if need be, until the next `seconds` fall in one shared-session window (at most `seconds`), so that
    every stage task of the test is expected in the same server-side session."""
    left = SHARED_SESSION_SECONDS - time.time() % SHARED_SESSION_SECONDS
    if left < seconds:
        time.sleep(left + 1)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_one_run_stages_several_batches_in_one_session_exactly_once(connect_server, service_env, topic, kafka,
                                                                    ledger_url, tmp_path):
    """ip_count in Connect mode with source.max_batches_per_run: 3: each run plans 3 batches of 500, one stage task
    stages them in order in the DAG's session (each from the watermark the one before leaves), one commit task
    commits them; the second DAG run's stage task reuses the first one's warm server-side session."""
    specs = connect_spec(tmp_path / "pipelines", topic, kafka.bootstrap_servers, max_records=500, batches_per_run=3)
    env = connect_env(service_env, specs, connect_server)
    lines = generate_lines(3_000, ips=25, span_seconds=40, out_of_order=0.1, malformed=0.05, seed=43)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)
    assert sum(1 for line in lines if line.malformed) > 100

    in_one_session_window(120)  # the run's two stage tasks take well under that (a mean wait of 4 s, at most 120)
    log = run_exactly_once(env, ledger_url, lines, coords, topic)
    with transaction(ledger_url) as session:
        batches = session.execute(text("SELECT id, airflow_run_id, run_head, state_before, state_after FROM batches "
                                       "WHERE state = 'committed' ORDER BY id")).all()
    assert [b.id for b in batches] == [1, 2, 3, 4, 5, 6]
    assert [b.run_head for b in batches] == [None, 1, 1, None, 4, 4]
    assert len({b.airflow_run_id for b in batches}) == 2
    assert all(later.state_before == earlier.state_after for earlier, later in itertools.pairwise(batches))
    assert "planned batches 1-3 (3 batches, in order)" in log and "planned batches 4-6" in log
    assert "staged batches 1,2,3 through Spark Connect" in log, log[-4000:]
    assert "staged batches 4,5,6 through Spark Connect" in log, log[-4000:]
    at = re.escape(display(connect_server.remote))
    sessions = [re.search(rf"stage ip_count: staged batches {ids} through Spark Connect at {at} in session "
                          rf"(\w{{8}})(?!\w)", log) for ids in ("1,2,3", "4,5,6")]
    assert all(sessions), log[-4000:]
    assert sessions[0].group(1) == sessions[1].group(1), "the second stage task did not reuse the warm session"
    assert "records, lag after this batch" in log and "rows merged into ip_counts" in log
    assert "Spark-Submit cmd" not in log  # no spark-submit: the server did the work
    password = make_url(ledger_url).password
    assert password and password not in log, "a secret leaked into the task logs"


def test_unreachable_server_fails_stage_with_one_sentence(connect_server, service_env, topic, kafka, ledger_url,
                                                          tmp_path):
    specs = connect_spec(tmp_path / "pipelines", topic, kafka.bootstrap_servers, max_records=1000)
    port = closed_port()
    # MICROBATCH_SPARK_REMOTE wins over the connection, which points at the live server.
    env = {**connect_env(service_env, specs, connect_server), "MICROBATCH_SPARK_REMOTE": f"sc://127.0.0.1:{port}"}
    produce_lines(kafka.bootstrap_servers, topic, generate_lines(200, seed=42))

    result = run_pipeline(env, max_runs=1, timeout=300)
    shown, log = result.stdout + result.stderr, run_log(result)
    assert result.returncode != 0
    sentence = (f"Cannot reach the Spark Connect server at sc://127.0.0.1:{port}: connection refused. Start it "
                "(`make connect`, or `python -m microbatch.dev.stack connect`")
    assert sentence in shown, log[-4000:]
    assert "MICROBATCH_SPARK_REMOTE or the Airflow connection 'spark_connect_default'" in shown
    assert "StatusCode" not in log and "grpc" not in log.lower()
    assert "stage failed" in result.stdout and "commit upstream_failed" in result.stdout
    with transaction(ledger_url) as session:
        states = session.execute(text("SELECT state, attempt FROM batches")).all()
    assert [tuple(row) for row in states] == [("planned", 0)]  # planned, never staged: the next run takes it


def test_stage_tasks_share_one_warm_session_and_open_their_own_once_it_is_closed(connect_server):
    from microbatch.phases.stage import CONNECT_MODE_ENV, connect_client_scope

    assert CONNECT_MODE_ENV not in os.environ
    with connect_client_scope():
        _share_and_reopen(connect_server)
    # pyspark marked this process as a Connect client; the scope took the mark off again, or every later
    # spark-submit started from this process (tests of submit mode) would inherit it.
    assert CONNECT_MODE_ENV not in os.environ


def _share_and_reopen(connect_server: SparkConnectServer) -> None:
    from microbatch.phases.stage import CONNECT_MODE_ENV, connect_session, server_session

    conf = {"spark.sql.shuffle.partitions": "3"}
    in_one_session_window(60)
    first = connect_session(connect_server.remote, conf, share_key="test_dag")
    assert os.environ.get(CONNECT_MODE_ENV) == "1"
    assert first.range(10).count() == 10
    shared = server_session(first)
    first.stop()  # the client goes; the session stays on the server

    second = connect_session(connect_server.remote, conf, share_key="test_dag")
    assert second.range(7).count() == 7 and server_session(second) == shared
    assert second.conf.get("spark.sql.shuffle.partitions") == "3"
    other = connect_session(connect_server.remote, conf, share_key="test_dag__backfill")
    assert other.range(2).count() == 2 and server_session(other) != shared  # another DAG, another session
    other.stop()

    second.client.release_session()  # the server closes it, as it does after an idle hour
    second.release_session_on_close = False
    second.stop()
    third = connect_session(connect_server.remote, conf, share_key="test_dag")  # its id is refused: a new session
    assert third.range(5).count() == 5 and server_session(third) != shared
    assert third.release_session_on_close  # a session of its own, released when the task ends
    third.stop()


def test_the_local_stacks_connect_server_killed_mid_stage_is_restarted_and_the_run_ends_exactly_once(
        service_env, topic, kafka, ledger_url, tmp_path):
    """The shipped default on one machine: `make connect`'s server (a cache of this test's own, so neither the
    suite's server nor a developer's is touched). Its JVM is SIGKILLed while the stage holds after "reading"
    (`stage.before_read=pause`): the stage gives up within the bounded Connect retries with its sentence, Airflow's
    retry finds the server dead, the local stack starts it again on the same port with the same token, the retry
    stages the batch, and the run ends exactly once, and exits."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("jars", "m2"):
        (cache / name).symlink_to(cache_dir() / name)
    stack = {**os.environ, "MICROBATCH_CACHE_DIR": str(cache)}
    up = subprocess.run([sys.executable, "-m", "microbatch.dev.stack", "connect"], env=stack, capture_output=True,
                        text=True, timeout=300, check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    state_file = cache / "devstack" / "state.json"
    state = json.loads(state_file.read_text())
    remote, port, first_pid = state["env"]["MICROBATCH_SPARK_REMOTE"], state["connect_port"], state["connect_pid"]
    assert state["connect_token"] not in up.stdout + up.stderr, "make connect printed its token"
    try:
        # The shipped `spark.mode: auto`, which MICROBATCH_SPARK_REMOTE (the stack's remote) makes a Connect client.
        specs = write_test_spec(tmp_path / "pipelines", topic, 100_000, bootstrap=kafka.bootstrap_servers)
        env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_CACHE_DIR": str(cache),
               "MICROBATCH_SPARK_REMOTE": remote, FAILPOINTS_ENV: "stage.before_read=pause:6",
               FAILPOINT_DIR_ENV: str(tmp_path / "fired")}
        lines = generate_lines(2_000, ips=20, span_seconds=30, out_of_order=0.1, malformed=0.05, seed=44)
        coords = produce_lines(kafka.bootstrap_servers, topic, lines)

        started = time.monotonic()
        with (tmp_path / "run.log").open("w") as out:
            run = subprocess.Popen([sys.executable, "-m", "microbatch.cli", "run", "ip_count", "--max-runs", "3"],
                                   env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 300
                while not (tmp_path / "fired" / "stage.before_read").exists():
                    assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
                    time.sleep(0.2)
                killed_at = time.monotonic()
                os.killpg(first_pid, signal.SIGKILL)  # the server's whole group: the JVM and its Python workers
                release("stage.before_read", tmp_path / "fired")  # the stage goes on now, not 6 s after its hold
                returncode = run.wait(timeout=900)  # a hang guard, not a timing: the test fails past it
            finally:
                if run.poll() is None:
                    run.kill()
        ended = time.monotonic()
        log = run_log((tmp_path / "run.log").read_text())  # what the run printed, then its log file
        assert returncode == 0, log[-5000:]
        gone = f"Cannot reach the Spark Connect server at {display(remote)}: the server went away during the stage"
        assert gone in log, log[-5000:]
        assert "had died: started it again on the same port with the same token" in log, log[-5000:]
        assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
        restarted = json.loads(state_file.read_text())
        assert restarted["connect_port"] == port and restarted["env"]["MICROBATCH_SPARK_REMOTE"] == remote
        assert restarted["connect_pid"] != first_pid
        for secret in (state["connect_token"], make_url(ledger_url).password):
            assert secret not in log
            assert secret not in (cache / "devstack" / "connect" / "connect-server.log").read_text(errors="replace")
        print(f"killed {killed_at - started:.1f} s into the run; the run ended {ended - killed_at:.1f} s later")
    finally:
        down = subprocess.run([sys.executable, "-m", "microbatch.dev.stack", "down"], env=stack,
                              capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not socket_open(port), "make down left the restarted Connect server running"


def socket_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_suites_connect_server_loads_the_formats_jar_and_a_missing_class_is_told_apart(spark_connect,
                                                                                          monkeypatch, caplog):
    """The local stack's Connect server starts with the formats jar (`runtime.spark_jars`): a client's session can
    register its Java functions. A class the server cannot load is refused at registration, over Connect too, so
    `jvm.available` says so in one line (and the stage would decode with the built-in functions)."""
    from pyspark.sql import SparkSession

    from microbatch.formats import jvm
    from microbatch.phases.stage import connect_client_scope

    # The scope unmarks this worker as a Connect client afterwards, as the stage does: a spark-submit a later test
    # starts from this process must not inherit SPARK_CONNECT_MODE_ENABLED.
    with connect_client_scope():
        session = SparkSession.builder.remote(spark_connect.remote).create()
        try:
            assert jvm.available(session)
            monkeypatch.setattr(jvm, "JSON_DECODER", "microbatch.formats.NoSuchDecoder")
            assert not jvm.available(session)
            assert "this Spark has no microbatch formats jar" in caplog.text
        finally:
            session.stop()
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
