"""The environment of the local stack: Airflow home, DAG folder, the Spark connection, PATH.

`make demo`, `make airflow` and the test suite all call `apply()`, so they agree on one setup.
Values already set by the user win, so the same commands work against external services.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def local_env(root: Path = ROOT) -> dict[str, str]:
    cache = Path(os.environ.get("MICROBATCH_CACHE_DIR") or root / ".cache")
    venv_bin = str(Path(sys.executable).parent)
    return {
        "AIRFLOW_HOME": str(cache / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
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
