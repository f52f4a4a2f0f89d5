"""The helpers of the `microbatch new` tests, which run in a fresh copy of the repository (its tracked files): the
copy's environment, a command in it, and a producer. The tests are tests/e2e/test_scaffold_from_topic_e2e.py
(`new --from-topic`, and `new --topic --format text` with a refused overwrite, in one copy) and
tests/e2e/test_tutorial_e2e.py (`new --from-topic`, and `new --format json` with its Python transform, as the
tutorial runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import migrated_airflow_home

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
