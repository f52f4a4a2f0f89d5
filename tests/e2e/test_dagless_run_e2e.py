"""`microbatch run` of a spec without its DAG file (issue 64): Airflow's `dag.test()` creates a DAG run only for a
DAG its metadata DB holds, so such a spec failed with "Cannot create DagRun ... the dag is not serialized". The
runner now writes the DAG it built from the spec there (`runner.serialize_without_file`), and the run goes on: here
on an empty topic, one DAG run whose plan finds nothing new, against a DAG folder that has no file at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import migrated_airflow_home, run_log, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e


def test_a_spec_without_its_dag_file_runs(ledger_url: str, kafka, topic: str, tmp_path: Path) -> None:
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=1000, bootstrap=kafka.bootstrap_servers)
    dags = tmp_path / "dags"
    dags.mkdir()
    env = {"MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
           "MICROBATCH_PIPELINES_DIR": str(specs), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW_HOME": str(migrated_airflow_home(tmp_path / "airflow"))}
    result = run_pipeline(env, max_runs=2)
    output = run_log(result)
    assert result.returncode == 0, output[-3000:]
    assert "not serialized" not in output
    assert "ip_count: no DAG file defines it; serialized the DAG built from its spec" in output, output[-3000:]
    assert ": success (plan skipped" in result.stdout, result.stdout
    assert not list(dags.iterdir())  # the runner wrote no file
