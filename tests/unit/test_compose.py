"""docker-compose.yaml cannot run here (no Docker engine); check its wiring instead: every setting
the code reads is set for every Airflow service, hostnames and ports agree, databases are separate,
images are pinned, and every dependency names a real service."""

import json
import re
from pathlib import Path

import yaml
from sqlalchemy import make_url

from microbatch.settings import BOOTSTRAP_ENV, LEDGER_URL_ENV

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")


def services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())["services"]


def url(value: str):
    return make_url(re.sub(r"\$\{[^}]+\}", "x", value))


def test_every_airflow_service_gets_every_setting_the_code_reads():
    for name in AIRFLOW:
        env = services()[name]["environment"]
        for key in (LEDGER_URL_ENV, BOOTSTRAP_ENV, "AIRFLOW_CONN_SPARK_DEFAULT", "AIRFLOW__CORE__DAGS_FOLDER",
                    "AIRFLOW__CORE__PLUGINS_FOLDER", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "PYTHONPATH"):
            assert env.get(key), f"{name} lacks {key}"
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/microbatch/dags"
        assert "/opt/microbatch/include" in env["PYTHONPATH"]


def test_hostnames_ports_and_databases_agree():
    all_services = services()
    env = all_services["airflow-scheduler"]["environment"]
    ledger, metadata = url(env[LEDGER_URL_ENV]), url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert ledger.host == metadata.host == "postgres" and ledger.port == metadata.port == 5432
    assert ledger.database != metadata.database, "the ledger must not live in Airflow's metadata DB"
    init = all_services["postgres"]["entrypoint"][-1]
    for database in (ledger.database, metadata.database):
        assert f"CREATE DATABASE {database}" in init
    assert "btree_gist" in init
    host, port = env[BOOTSTRAP_ENV].split(":")
    kafka = all_services["kafka"]["environment"]
    assert host == "kafka" and f"PLAINTEXT://{host}:{port}" in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    master = all_services["spark-master"]["command"]
    assert f"--host {spark['host'].removeprefix('spark://')} --port {spark['port']}" in master
    assert f"spark://spark-master:{spark['port']}" in all_services["spark-worker"]["command"]


def test_images_are_pinned_and_dependencies_exist():
    all_services = services()
    for name, service in all_services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name} image {image} is not pinned"
        for dependency in service.get("depends_on", []):
            assert dependency in all_services, f"{name} depends on unknown service {dependency}"
    assert (ROOT / "include/docker/airflow-entrypoint.sh").exists()
    for name in AIRFLOW[1:]:
        assert all_services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"


def test_spark_connect_service_is_wired_to_the_cluster_and_to_airflow():
    from microbatch.settings import SPARK_REMOTE_ENV
    from microbatch.spark_remote import host_port

    all_services = services()
    connect = all_services["spark-connect"]
    assert connect["image"] == all_services["spark-master"]["image"] == all_services["spark-worker"]["image"]
    command = " ".join(connect["command"].split())
    assert "--class org.apache.spark.sql.connect.service.SparkConnectServer" in command
    assert "--master spark://spark-master:7077" in command
    port = int(re.search(r"spark\.connect\.grpc\.binding\.port=(\d+)", command).group(1))
    assert f"127.0.0.1:{port}:{port}" in connect["ports"]  # plaintext gRPC: loopback only (test_compose_security)
    assert "spark-master" in connect["depends_on"]
    # The connectors the stage reads and writes with, at the versions the Maven pom fetches for spark-submit.
    pom = (ROOT / "include/jars/spark/pom.xml").read_text()
    spark_version = re.search(r"<spark.version>([^<]+)<", pom).group(1)
    postgres_version = re.search(r"<artifactId>postgresql</artifactId>\s*<version>([^<]+)<", pom).group(1)
    assert connect["image"].split(":")[1].startswith(spark_version)
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}" in command
    assert f"org.postgresql:postgresql:{postgres_version}" in command
    assert "spark.sql.session.timeZone=UTC" in command
    # The formats jar (runtime.formats_jar, in the project's .cache, which the service mounts), compiled by
    # airflow-init (`stack jars`) before the server starts.
    jars = re.search(r"--jars (\S+)", command).group(1)
    assert jars == "/opt/microbatch/.cache/jars/microbatch/microbatch-formats-*.jar"
    assert connect["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    assert "stack jars" in " ".join(all_services["airflow-init"]["command"])
    assert "openjdk-17-jdk-headless" in (ROOT / "include/docker/airflow-entrypoint.sh").read_text()
    # Every Airflow service reaches it through MICROBATCH_SPARK_REMOTE (it wins over the spark_connect
    # connection), which carries the server's token (tests/unit/test_compose_security.py).
    for name in AIRFLOW:
        assert host_port(all_services[name]["environment"][SPARK_REMOTE_ENV]) == ("spark-connect", port)


def test_the_schema_registry_service_runs_the_local_stacks_version_and_every_airflow_service_reaches_it():
    from urllib.parse import urlsplit

    from microbatch.dev.registry import APICURIO_VERSION, CCOMPAT_PATH
    from microbatch.settings import SCHEMA_REGISTRY_URL_ENV

    all_services = services()
    registry = all_services["apicurio-registry"]
    assert registry["image"] == f"apicurio/apicurio-registry-sql:{APICURIO_VERSION}"  # the local stack's version
    assert "ports" not in registry  # the compose network only (tests/unit/test_compose_security.py)
    for name in AIRFLOW:
        service = all_services[name]
        url = urlsplit(service["environment"][SCHEMA_REGISTRY_URL_ENV])
        assert (url.scheme, url.hostname, url.port, url.path) == ("http", "apicurio-registry", 8080, CCOMPAT_PATH)
        assert service["depends_on"]["apicurio-registry"] == {"condition": "service_started"}


def test_the_schema_registry_keeps_its_schemas_in_the_stacks_postgres_and_defaults_to_backward():
    """Issue 64: compose's registry kept its schemas in memory and took any new version (Apicurio's default, NONE)."""
    from microbatch.dev.registry import COMPATIBILITY

    all_services = services()
    registry = all_services["apicurio-registry"]
    env = registry["environment"]
    assert env["REGISTRY_RULES_GLOBAL_COMPATIBILITY"] == COMPATIBILITY == "BACKWARD"  # as the local stack's
    storage = url(env["REGISTRY_DATASOURCE_URL"].removeprefix("jdbc:"))
    assert (storage.drivername, storage.host, storage.port) == ("postgresql", "postgres", 5432)
    ledger = url(all_services["airflow-scheduler"]["environment"][LEDGER_URL_ENV])
    assert storage.database not in (ledger.database, "airflow"), "the registry's tables in a database of their own"
    init = all_services["postgres"]["entrypoint"][-1]
    assert f"CREATE DATABASE {storage.database} OWNER {env['REGISTRY_DATASOURCE_USERNAME']};" in init
    assert env["REGISTRY_DATASOURCE_USERNAME"] == ledger.username
    assert env["REGISTRY_DATASOURCE_PASSWORD"] == "${MICROBATCH_DB_PASSWORD:?run include/docker/make-env.sh}"
    assert registry["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_the_compose_scheduler_preloads_the_task_modules_as_the_local_stack_does():
    from microbatch.dev.airflow import PRELOAD

    env = services()["airflow-scheduler"]["environment"]
    assert {key: env.get(key) for key in PRELOAD} == PRELOAD


def test_every_long_running_service_restarts_and_the_one_shot_init_until_it_completes():
    for name, service in services().items():
        expected = "on-failure" if name == "airflow-init" else "unless-stopped"
        assert service.get("restart") == expected, f"{name}: restart is {service.get('restart')!r}"
