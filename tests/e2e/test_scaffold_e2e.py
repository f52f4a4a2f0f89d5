"""`microbatch new` writes a pipeline that runs as generated: in a fresh copy of the repository (its tracked
files), `microbatch new` for a JSON and a text pipeline, the copy's `ruff check` and the generated unit
tests, then `microbatch migrate` and `microbatch run NAME` on real Kafka, Postgres, Spark and Airflow; each
table holds exactly the produced records (the malformed ones are dead letters). A second `new` with the same
name is refused in one sentence, and nothing is overwritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import transaction
from tests.e2e.helpers import migrated_airflow_home
from tests.e2e.test_demo_e2e import _fresh_copy

pytestmark = pytest.mark.e2e


def _env(copy: Path, tmp_path: Path, service_env: dict[str, str]) -> dict[str, str]:
    """The copy's code, its dags/ and an Airflow home of its own; nothing points at this checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MICROBATCH_PIPELINES_DIR", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW_HOME")}
    home = migrated_airflow_home(tmp_path / "airflow")
    return {**env, **service_env, "PYTHONPATH": f"{copy / 'include'}{os.pathsep}{copy}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(copy / "dags"), "AIRFLOW_HOME": str(home)}


def _run(env: dict[str, str], copy: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in values:
            producer.send(topic, value=value)
        producer.flush()
    finally:
        producer.close()


def test_new_pipelines_run_as_generated(service_env, kafka, ledger_url, tmp_path: Path) -> None:
    copy = _fresh_copy(tmp_path / "repo")
    env = _env(copy, tmp_path, service_env)
    suffix = uuid.uuid4().hex[:6]
    orders, lines = f"orders_{suffix}", f"lines_{suffix}"
    orders_topic, lines_topic = f"{orders}_src", f"{lines}_src"
    for topic in (orders_topic, lines_topic):
        create_topic(kafka.bootstrap_servers, topic, 2)

    made = _run(env, copy, "-m", "microbatch.cli", "new", orders, "--topic", orders_topic, "--format", "json",
                "--columns", "id:text,amount:bigint")
    assert made.returncode == 0, made.stdout + made.stderr
    made = _run(env, copy, "-m", "microbatch.cli", "new", lines, "--topic", lines_topic, "--format", "text")
    assert made.returncode == 0, made.stdout + made.stderr
    written = [copy / "include" / "pipelines" / f"{orders}.yaml", copy / "spark_jobs" / f"{orders}.py",
               copy / "tests" / "unit" / f"test_{orders}.py", copy / "dags" / f"{orders}.py"]
    assert all(path.exists() for path in written)
    before = {path: path.read_text() for path in written}

    again = _run(env, copy, "-m", "microbatch.cli", "new", orders, "--topic", "x", "--format", "text")
    assert again.returncode == 2 and again.stdout.strip().startswith("error: ")
    assert "exists already" in again.stdout and "Traceback" not in again.stdout + again.stderr
    assert {path: path.read_text() for path in written} == before, "a refused `new` overwrote a file"

    lint = _run(env, copy, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    unit = _run(env, copy, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"tests/unit/test_{orders}.py",
                f"tests/unit/test_{lines}.py")
    assert unit.returncode == 0, unit.stdout[-3000:] + unit.stderr[-3000:]

    good_orders = [{"id": f"o{i}", "amount": i * 10} for i in range(40)]
    bad_orders = [b"{not json", b'{"id": "o1"}', b'{"id": "o2", "amount": "many"}']
    _produce(kafka.bootstrap_servers, orders_topic, [json.dumps(o).encode() for o in good_orders] + bad_orders)
    good_lines = [f"line {i}: GET /page/{i % 3}" for i in range(25)]
    _produce(kafka.bootstrap_servers, lines_topic, [line.encode() for line in good_lines] + [b""])

    migrated = _run(env, copy, "-m", "microbatch.cli", "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    for name in (orders, lines):
        ran = _run(env, copy, "-m", "microbatch.cli", "run", name, "--max-runs", "5", timeout=900)
        assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]

    with transaction(ledger_url) as session:
        stored = session.execute(text(f"SELECT id, amount FROM {orders}")).all()
        assert sorted(stored) == sorted((o["id"], o["amount"]) for o in good_orders)
        stored = session.execute(text(f"SELECT line FROM {lines}")).scalars().all()
        assert sorted(stored) == sorted(good_lines)
        dead = session.execute(text("SELECT topic, count(*) FROM dead_letters GROUP BY topic")).all()
        assert dict(dead) == {orders_topic: len(bad_orders), lines_topic: 1}
    for name in (orders, lines):
        audit = _run(env, copy, "-m", "microbatch.cli", "verify", name)
        assert audit.returncode == 0, audit.stdout + audit.stderr
