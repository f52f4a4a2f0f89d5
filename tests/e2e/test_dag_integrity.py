"""Every DAG file imports cleanly, with tags, retries and one run at a time; a bad spec breaks
only its own DAG; parsing does no network or database I/O."""

from __future__ import annotations

import copy
import json
import shutil
import socket
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_dagbag(dag_folder: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(dag_folder))


def test_dags_import_with_tags_and_retries(monkeypatch):
    monkeypatch.delenv("MICROBATCH_SPARK_REMOTE", raising=False)  # the shipped `spark.mode: auto`: spark-submit
    bag = load_dagbag(ROOT / "dags")
    assert bag.import_errors == {}
    dag = bag.dags["ip_count"]
    assert "microbatch" in dag.tags
    assert dag.max_active_runs == 1
    assert [t.task_id for t in dag.topological_sort()] == ["plan", "stage", "commit", "publish"]
    assert dag.get_task("stage").task_type == "SubmitStageOperator"
    assert "{{ ti.xcom_pull(task_ids='plan') }}" in dag.get_task("stage").application_args
    assert dag.get_task("publish").trigger_rule == "none_failed"
    for task in dag.tasks:
        assert task.retries == 3
        assert task.retry_delay.total_seconds() == 10
    commit = dag.get_task("commit")
    assert [(a.name, a.uri) for a in commit.outlets] == [("microbatch.ip_count.ip_counts", "microbatch://ip_count/ip_counts")]
    assert [a.uri for a in dag.get_task("publish").outlets] == ["microbatch://ip_count/ip_count_sink"]
    clicks = bag.dags["clicks"]  # every table a sink writes is an asset: append, aggregate, upsert and Delta
    assert [a.uri for a in clicks.get_task("commit").outlets] == [
        "microbatch://clicks/clicks_raw", "microbatch://clicks/page_views", "microbatch://clicks/user_last_page",
        "microbatch://clicks/clicks_lake"]
    assert [a.uri for a in clicks.get_task("publish").outlets] == ["microbatch://clicks/clicks_out"]
    backfill = bag.dags["ip_count__backfill"]
    assert backfill.schedule is None or str(backfill.timetable.summary) in ("None", "")
    assert set(backfill.params) == {"topic", "partitions", "start", "end", "start_time", "end_time", "mode", "dry_run"}
    assert [t.task_id for t in backfill.topological_sort()] == ["plan", "stage", "commit", "publish"]
    # Airflow 3's form renders a field of several JSON types as a JSON text area: each field has one (issue 45).
    for name, param in backfill.params.items():
        kinds = param.schema["type"] if isinstance(param.schema["type"], list) else [param.schema["type"]]
        assert len([k for k in kinds if k != "null"]) == 1, (name, param.schema)
    assert {n: backfill.params.get_param(n).schema["type"] for n in ("start", "end", "partitions")} == {
        "start": "integer", "end": ["null", "integer"], "partitions": "string"}
    from microbatch.phases.backfill import form_params

    for given in (("0", "latest", "all"), ("5", "90", "0, 2"), ("2026-11-22T12:00:00Z", "2026-11-22T13:00:00Z", "3")):
        conf = form_params("ip_count_source", *given, "fill", True)
        checked = copy.deepcopy(backfill.params)
        checked.update(conf)
        checked.validate()  # what Airflow does to a triggered run's conf


def test_bad_spec_breaks_only_its_own_dag(tmp_path, monkeypatch):
    specs, dags = tmp_path / "pipelines", tmp_path / "dags"
    specs.mkdir()
    dags.mkdir()
    good = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    (specs / "ip_count.yaml").write_text(yaml.safe_dump(good))
    bad = dict(good, name="broken", source={**good["source"], "max_records_per_batch": "lots"})
    (specs / "broken.yaml").write_text(yaml.safe_dump(bad))
    shutil.copy(ROOT / "dags/ip_count.py", dags / "ip_count.py")
    (dags / "broken.py").write_text((ROOT / "dags/ip_count.py").read_text().replace('"ip_count"', '"broken"'))
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    bag = load_dagbag(dags)
    assert "ip_count" in bag.dags and "broken" not in bag.dags
    assert list(bag.import_errors) == [str(dags / "broken.py")]
    error = bag.import_errors[str(dags / "broken.py")]
    assert "broken.yaml: field 'source.max_records_per_batch'" in error


def test_parsing_does_no_network_io(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a DAG file opened a network connection at parse time")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("MICROBATCH_LEDGER_URL", raising=False)
    monkeypatch.delenv("MICROBATCH_KAFKA_BOOTSTRAP", raising=False)
    bag = load_dagbag(ROOT / "dags")
    assert bag.import_errors == {}


pytestmark = pytest.mark.e2e


def test_connect_mode_stage_is_the_connect_operator_between_plan_and_commit(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a DAG file opened a network connection at parse time")

    specs = tmp_path / "pipelines"
    specs.mkdir()
    spec = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    spec["spark"] = {"mode": "connect", "conf": spec["spark"]["conf"]}
    (specs / "ip_count.yaml").write_text(yaml.safe_dump(spec))
    for other in (ROOT / "include/pipelines").glob("*.yaml"):  # the other shipped DAGs read their specs too
        if other.name != "ip_count.yaml":
            shutil.copy(other, specs / other.name)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    monkeypatch.setattr(socket.socket, "connect", refuse)
    bag = load_dagbag(ROOT / "dags")
    assert bag.import_errors == {}
    for dag_id in ("ip_count", "ip_count__backfill"):
        dag = bag.dags[dag_id]
        assert [t.task_id for t in dag.topological_sort()] == ["plan", "stage", "commit", "publish"]
        stage = dag.get_task("stage")
        assert stage.task_type == "ConnectStageOperator"
        assert stage.upstream_task_ids == {"plan"} and stage.retries == 3
        assert dag.get_task("commit").upstream_task_ids == {"plan", "stage"}
        assert stage.batch_ids == "{{ ti.xcom_pull(task_ids='plan') }}"  # plan's batch id(s), as submit mode reads them


def test_shipped_pipelines_stage_on_the_connect_server_where_the_stack_sets_one(monkeypatch):
    """The path of `make demo` / `make airflow`: the shipped specs (no MICROBATCH_PIPELINES_DIR), `spark.mode: auto`,
    and the stack's MICROBATCH_SPARK_REMOTE: every DAG stages as a Connect client; without it, spark-submit."""
    monkeypatch.delenv("MICROBATCH_PIPELINES_DIR", raising=False)
    monkeypatch.setenv("MICROBATCH_SPARK_REMOTE", "sc://localhost:15010/;token=t")
    bag = load_dagbag(ROOT / "dags")
    assert bag.import_errors == {}
    for dag_id in ("ip_count", "ip_count__backfill", "clicks", "clicks__backfill"):
        assert bag.dags[dag_id].get_task("stage").task_type == "ConnectStageOperator", dag_id
    monkeypatch.delenv("MICROBATCH_SPARK_REMOTE")
    bag = load_dagbag(ROOT / "dags")
    assert {bag.dags[d].get_task("stage").task_type for d in ("ip_count", "clicks")} == {"SubmitStageOperator"}


def test_spark_remote_from_env_or_spark_connect_connection(monkeypatch):
    from microbatch.airflow.hooks import spark_remote
    from microbatch.errors import ConnectionSettingsError
    from microbatch.spark_remote import display

    monkeypatch.delenv("MICROBATCH_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", raising=False)
    missing = "neither MICROBATCH_SPARK_REMOTE nor the Airflow connection 'spark_connect_default' exists"
    with pytest.raises(ConnectionSettingsError, match=missing):
        spark_remote("spark_connect_default")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", json.dumps(
        {"conn_type": "spark_connect", "host": "sc://spark-connect", "port": 15002, "password": "s3cr3t-token"}))
    remote = spark_remote("spark_connect_default")  # built by the provider's SparkConnectHook
    assert remote.startswith("sc://spark-connect:15002/") and "token=s3cr3t-token" in remote
    assert display(remote) == "sc://spark-connect:15002"
    monkeypatch.setenv("MICROBATCH_SPARK_REMOTE", "sc://127.0.0.1:15010")
    assert spark_remote("spark_connect_default") == "sc://127.0.0.1:15010"
    monkeypatch.delenv("MICROBATCH_SPARK_REMOTE")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", json.dumps({"conn_type": "spark_connect"}))
    with pytest.raises(ConnectionSettingsError, match="is not a usable Spark Connect connection: it needs a host"):
        spark_remote("spark_connect_default")
