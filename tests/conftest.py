"""Shared fixtures: a real PostgreSQL, a real Kafka broker and a token-protected Spark Connect server on loopback,
each started once per session, and one Airflow home whose metadata DB is migrated once.

Nothing here is mocked. Each test that needs a ledger gets a fresh database migrated by Alembic, and its own
topics and pipeline specs; the pipelines of the e2e tests stage through the shared Connect server (the shipped
`spark.mode: auto` with MICROBATCH_SPARK_REMOTE set, as on the local stack) unless spark-submit is the subject.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from microbatch.dev import localenv
from tests import leftovers

# pytest-xdist's workers get COLUMNS=80 and LINES=24 from execnet; a user's pipe or file has neither, and the CLI's
# tables are as wide as their values there. The tests run the CLI as the user does.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
# Every process this run starts carries the run's marker (`<id>/<worker>` in an xdist worker), so that its end finds
# any it left (tests/leftovers.py, pytest_sessionfinish below).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
os.environ[leftovers.RUN_ENV] = f"{os.environ.get(leftovers.RUN_ENV)}/{_WORKER}" if _WORKER else uuid.uuid4().hex
# A fresh Airflow metadata DB per test session, so runs of the suite never see each other's DAG runs.
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="microbatch-airflow-")
localenv.apply()
ROOT = Path(__file__).resolve().parents[1]
# The change-data-capture fixtures (`cdc_source`, `cdc`): a source PostgreSQL and a Kafka Connect worker with Debezium.
pytest_plugins = ["tests.cdc_fixtures"]


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def postgres(work_dir: Path) -> Iterator[object]:
    from microbatch.dev.postgres import LocalPostgres

    server = LocalPostgres(work_dir / "postgres")
    try:  # a start that fails partway stops what it started too
        server.start()
        yield server
    finally:
        server.stop()
        _discard_postgres_data(work_dir / "postgres")


def _discard_postgres_data(folder: Path) -> None:
    """The suite's PostgreSQL data is throwaway: as root it lives under /var/tmp (dev/postgres_root.py), kept until
    its checkout is gone, so remove the folder, then that data."""
    shutil.rmtree(folder, ignore_errors=True)
    if os.geteuid() == 0:
        from microbatch.dev.postgres_root import prune

        prune()


def pytest_sessionstart(session: pytest.Session) -> None:
    """As root, remove the moved PostgreSQL data of test checkouts that are gone (an earlier run's tmp folders)."""
    if os.geteuid() == 0 and not os.environ.get("PYTEST_XDIST_WORKER"):
        from microbatch.dev.postgres_root import prune

        prune()


@pytest.fixture(scope="session")
def kafka(work_dir: Path) -> Iterator[object]:
    from microbatch.dev.kafka import KafkaBroker

    broker = KafkaBroker(work_dir / "kafka")
    try:
        broker.start()
        _migrate_shipped_output_topics(broker.bootstrap_servers)
        yield broker
    finally:
        broker.stop()


def _migrate_shipped_output_topics(bootstrap: str) -> None:
    """The output topics of the shipped specs, as `microbatch migrate` creates them on the local stack (the plan
    refuses a batch of a pipeline whose output topic is missing; many tests plan the shipped ip_count)."""
    from microbatch.config import load_spec, spec_paths
    from microbatch.kafka.topics import migrate_output_topics
    from microbatch.settings import KafkaSettings

    for path in spec_paths(ROOT / "include" / "pipelines"):
        migrate_output_topics(load_spec(path), lambda _: KafkaSettings(bootstrap))


@pytest.fixture(scope="session")
def spark_connect(work_dir: Path) -> Iterator[object]:
    """One Spark Connect server for the suite, with a token as the local stack's (`make connect`); tests that kill
    or restart a server start one of their own."""
    import secrets

    from microbatch.dev.spark import SparkConnectServer

    server = SparkConnectServer(work_dir / "connect", master="local[2]", driver_memory="2g",
                                token=secrets.token_hex(24))
    try:
        server.start()
        yield server
    finally:
        server.stop()


# The migrated ledger databases this session copies, by the spec files `migrate` read to make them.
LEDGER_TEMPLATES: dict[str, str] = {}


def _migrated_template(postgres) -> str:
    """A database that `migrate` made (the ledger at head and the sink tables of every spec in the pipelines
    directory), once per session and set of spec files; its name."""
    import hashlib

    from microbatch.config import spec_paths
    from microbatch.ledger.database import get_engine
    from microbatch.sinks.schema import migrate

    specs = hashlib.sha256()
    for path in spec_paths():
        specs.update(f"{path}\0".encode() + path.read_bytes() + b"\0")
    key = specs.hexdigest()
    if key not in LEDGER_TEMPLATES:
        name = f"template_{key[:10]}"
        postgres.create_database(name)
        url = postgres.url(name)
        migrate(url)
        get_engine(url).dispose()  # a template is copied only while nobody is connected to it
        LEDGER_TEMPLATES[key] = name
    return LEDGER_TEMPLATES[key]


@pytest.fixture
def ledger_url(postgres) -> str:
    """A fresh, migrated ledger database for one test: a copy (`CREATE DATABASE ... TEMPLATE`) of one that
    `migrate` made from the same spec files, the Alembic migrations and the sink tables once per session instead of
    about 1.5 s of them per test."""
    import psycopg

    template = _migrated_template(postgres)
    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password,
                         dbname="postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return postgres.url(name)


@pytest.fixture
def topic(kafka) -> str:
    """A fresh 4-partition topic for one test."""
    from microbatch.dev.kafka import create_topic

    name = f"t_{uuid.uuid4().hex[:10]}"
    create_topic(kafka.bootstrap_servers, name, 4)
    return name


@pytest.fixture
def service_env(ledger_url: str, kafka, spark_connect, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The connections of a pipeline run: the test's ledger, the broker, and the suite's Spark Connect server
    (a spec in `spark.mode: auto` or `connect` stages there; one in `submit` ignores it)."""
    env = {"MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
           "MICROBATCH_SPARK_REMOTE": spark_connect.remote}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


LONGEST_FIRST = (
    "test_crash_recovery.py", "test_delta_sink_e2e.py", "test_dead_letters_e2e.py", "test_demo_e2e.py",
    "test_harness_cluster.py", "test_avro_e2e.py", "test_connect_mode.py", "test_secure_defaults.py",
    "test_harness.py", "test_cli_errors.py", "test_iceberg_sink_e2e.py", "test_row_sinks_crash_points.py",
)
"""The slowest files of the chaos and end-to-end tiers, slowest first (a `make test` durations table). Only an
order: a file missing here runs after these, in its tier's order."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Run the fast tiers first, so a broken unit fails before the slow end-to-end suite starts.
    # Under pytest-xdist (`make test`), the chaos and end-to-end tests run longest first: a worker that runs out
    # steals from the end of the other's queue, so the last tests to finish are short ones and no worker waits
    # alone for a long one at the end.
    order = {"unit": 0, "integration": 1, "chaos": 2, "e2e": 2}
    slow = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (order.get(Path(item.fspath).parent.name, 9),
                                 slow.get(Path(item.fspath).name, len(slow))))



# Seconds spent setting up each fixture, by name, for tests/durations.py (with the JUnit XML of `make test`).
FIXTURE_SECONDS: dict[str, float] = {}
FIXTURE_REPORT_ENV = "MICROBATCH_FIXTURE_REPORT"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[object]:
    started = time.monotonic()
    try:
        return (yield)
    finally:
        name = f"{fixturedef.argname} ({fixturedef.scope})"
        FIXTURE_SECONDS[name] = FIXTURE_SECONDS.get(name, 0.0) + time.monotonic() - started


# What the xdist workers found left running at their end (pytest_sessionfinish), for the controller to report.
WORKER_LEFTOVERS: list[str] = []
LEFTOVERS_KEY = "leftover_processes"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist, at the controller: a worker ended; keep what it found left running."""
    WORKER_LEFTOVERS.extend(f"{node.gateway.id}: {name}"  # type: ignore[attr-defined]
                            for name in getattr(node, "workeroutput", {}).get(LEFTOVERS_KEY, []))


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    target = os.environ.get(FIXTURE_REPORT_ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if target and FIXTURE_SECONDS:  # the xdist controller runs no fixture
        path = Path(target)
        if worker:  # each pytest-xdist worker its own file; tests/durations.py adds them up
            path = path.with_name(f"{path.stem}-{worker}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(FIXTURE_SECONDS, indent=1, sort_keys=True))
    result = yield  # the other implementations: the xdist controller's stops its workers
    # Every service a test or a fixture started must have been stopped by now, passed or failed: name any left
    # (and stop it) and fail the run. A worker hands its list to the controller, which checks all markers too.
    controller = session.config.pluginmanager.hasplugin("dsession")
    found = leftovers.check(with_workers=controller, grace_s=10.0 if controller else 3.0)
    output = getattr(session.config, "workeroutput", None)  # an xdist worker's (not a pytest a test runs in one)
    if output is not None:
        output[LEFTOVERS_KEY] = found
        return result
    found = WORKER_LEFTOVERS + found
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{len(found)} processes of this test run were still running at its end (now stopped):", *found]
        for line in lines:
            (reporter.write_line(line, red=True) if reporter else print(line, file=sys.stderr))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
