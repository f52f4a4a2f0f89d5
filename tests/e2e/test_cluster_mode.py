"""The stage task on a real Spark standalone cluster (a master and two workers, separate JVMs
started from the pyspark wheel), with the library shipped by --py-files; exact counts."""

from __future__ import annotations

import json
import urllib.request

import pytest

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.dev.spark import SparkStandalone
from tests.e2e.helpers import assert_exactly_once, run_log, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path):
    spark = SparkStandalone(tmp_path / "spark", workers=2, cores_per_worker=1, memory="1g").start()
    yield spark
    spark.stop()


def test_ip_count_on_a_standalone_cluster(cluster, service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=3000, bootstrap=kafka.bootstrap_servers,
                            spark_mode="submit")
    connection = {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.port}
    # client_env: the cluster runs with spark.authenticate; its secret reaches spark-submit through SPARK_CONF_DIR.
    env = {**service_env, **cluster.client_env(), "MICROBATCH_PIPELINES_DIR": str(specs),
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(connection)}
    lines = generate_lines(5_000, ips=30, span_seconds=60, out_of_order=0.1, malformed=0.03, seed=31)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)

    result = run_pipeline(env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"master {cluster.master_url}" in run_log(result)
    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.webui_port}/json/", timeout=5) as response:
        status = json.load(response)
    assert len(status["completedapps"]) >= 2  # one application per staged batch ran on the cluster
