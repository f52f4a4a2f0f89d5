"""Shared fixtures: a real PostgreSQL and a real Kafka broker on loopback, started once per session.

Nothing here is mocked. Each test that needs a ledger gets a fresh database migrated by Alembic.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from microbatch.dev import localenv

# A fresh Airflow metadata DB per test session, so runs of the suite never see each other's DAG runs.
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="microbatch-airflow-")
localenv.apply()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def postgres(work_dir: Path) -> Iterator[object]:
    from microbatch.dev.postgres import LocalPostgres

    server = LocalPostgres(work_dir / "postgres")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka(work_dir: Path) -> Iterator[object]:
    from microbatch.dev.kafka import KafkaBroker

    broker = KafkaBroker(work_dir / "kafka")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def ledger_url(postgres) -> str:
    """A fresh, migrated ledger database for one test."""
    from microbatch.ledger.database import migrate

    name = f"t_{uuid.uuid4().hex[:10]}"
    postgres.create_database(name)
    url = postgres.url(name)
    migrate(url)
    return url


@pytest.fixture
def topic(kafka) -> str:
    """A fresh 4-partition topic for one test."""
    from microbatch.dev.kafka import create_topic

    name = f"t_{uuid.uuid4().hex[:10]}"
    create_topic(kafka.bootstrap_servers, name, 4)
    return name


@pytest.fixture
def service_env(ledger_url: str, kafka, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_KAFKA_BOOTSTRAP": kafka.bootstrap_servers}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Run the fast tiers first, so a broken unit fails before the slow end-to-end suite starts.
    order = {"unit": 0, "integration": 1, "e2e": 2, "chaos": 3}
    items.sort(key=lambda item: order.get(Path(item.fspath).parent.name, 9))

