"""`microbatch.airflow.preload`, the module the scheduler's forkserver imports (dev/airflow.py PRELOAD):
importing it imports every module it lists, and a module that fails to import leaves it importable."""

import subprocess
import sys
from pathlib import Path

from microbatch.dev.airflow import PRELOAD

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import sys
{before}
import microbatch.airflow.preload as p
missing = [m for m in p.MODULES if sys.modules.get(m) is None]
print("missing:", missing)
import sqlalchemy
from microbatch.ledger.models import Batch
print("configured:", sqlalchemy.inspect(Batch).configured)
import gc
print("frozen:", gc.get_freeze_count() > 100_000)
"""


def run(home: Path, before: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'include'}:{ROOT}", "PATH": "/usr/bin:/bin", "HOME": str(home),
           "AIRFLOW_HOME": str(home / "airflow")}
    return subprocess.run([sys.executable, "-c", CHECK.format(before=before)], check=False, capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_the_scheduler_setting_names_the_preload_module():
    assert PRELOAD["AIRFLOW__SCHEDULER__MP_START_METHOD"] == "forkserver"
    assert PRELOAD["AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD"].split(",")[-1] == "microbatch.airflow.preload"


def test_importing_the_preload_module_imports_what_the_tasks_import(tmp_path: Path):
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "missing: []" in result.stdout
    # The ORM's mappers are configured once, here, not at each task's first query.
    assert "configured: True" in result.stdout
    # ... and what it imported is frozen, out of the collector's sight in every forked task.
    assert "frozen: True" in result.stdout


def test_a_module_that_fails_to_import_is_logged_and_the_rest_still_load(tmp_path: Path):
    # A broken kafka package: the forkserver must still start, and say which module it skipped.
    result = run(tmp_path, "sys.modules['kafka'] = None")
    assert result.returncode == 0, result.stderr[-2000:]
    missing = result.stdout.rsplit("missing: ", 1)[1]
    assert missing.startswith("['kafka'") and "pandas" not in missing and "pyspark" not in missing, missing
    assert "microbatch preload: kafka was not imported" in result.stdout + result.stderr
