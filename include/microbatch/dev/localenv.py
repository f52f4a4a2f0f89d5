"""The environment of the local stack: Airflow home, DAG folder, the Spark connection, PATH.

`make demo`, `make airflow` and the test suite all call `apply()`, so they agree on one setup.
Values already set by the user win, so the same commands work against external services.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from microbatch.runtime import PROJECT_ROOT as ROOT
from microbatch.runtime import cache_dir


def local_env(root: Path = ROOT) -> dict[str, str]:
    cache = cache_dir()
    venv_bin = str(Path(sys.executable).parent)
    return {
        "AIRFLOW_HOME": str(cache / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The local stack listens on loopback only (docs/running-for-real.md); Airflow's default is 0.0.0.0.
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "include"), str(root), os.environ.get("PYTHONPATH")])),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def apply(root: Path = ROOT) -> dict[str, str]:
    """Set the local defaults in os.environ where the user has not set them; return them."""
    env = local_env(root)
    for key, value in env.items():
        if key in ("PATH", "PYTHONPATH"):
            if value.split(os.pathsep)[0] not in os.environ.get(key, "").split(os.pathsep):
                os.environ[key] = value
        else:
            os.environ.setdefault(key, value)
    Path(os.environ["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def running_stack_env() -> dict[str, str]:
    """The connections of the local stack that `make demo` or `make airflow` started, if it is running
    (its state file exists and its Kafka and PostgreSQL ports answer); else {}."""
    state_file = cache_dir() / "devstack" / "state.json"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return {}
    ports = [state.get("kafka_port"), state.get("postgres_port")]
    if not all(ports) or not all(_listening(port) for port in ports):
        return {}
    return dict(state.get("env") or {})


def use_running_stack() -> dict[str, str]:
    """Point this process at the running local stack for each connection the user has not set, so the
    CLI works after `make demo` without `source .cache/devstack/env.sh`; return what was set."""
    found = {k: v for k, v in running_stack_env().items() if not os.environ.get(k)}
    os.environ.update(found)
    return found
