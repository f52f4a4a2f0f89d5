"""docker-compose.yaml cannot run here (no Docker engine); check its wiring instead: the
environment names the code reads, the connection formats, and the service references."""

import json
from pathlib import Path

import yaml
from sqlalchemy import make_url

from microbatch.kafka_offsets import BOOTSTRAP_ENV
from microbatch.ledger.database import LEDGER_URL_ENV

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def test_airflow_gets_every_setting_the_code_reads():
    services = compose()["services"]
    env = services["airflow"]["environment"]
    assert make_url(env[LEDGER_URL_ENV].replace("${MICROBATCH_DB_PASSWORD:-microbatch}", "x")).host == "postgres"
    host, port = env[BOOTSTRAP_ENV].split(":")
    assert host == "kafka" and port in services["kafka"]["environment"]["KAFKA_LISTENERS"]
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark["host"] == "spark://spark-master:7077"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"].endswith("/dags")


def test_services_reference_each_other_consistently():
    services = compose()["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
    pg = services["postgres"]["environment"]
    url = make_url(services["airflow"]["environment"][LEDGER_URL_ENV].replace("${MICROBATCH_DB_PASSWORD:-microbatch}",
                                                                               "x"))
    assert url.username == pg["POSTGRES_USER"] and url.database == pg["POSTGRES_DB"]
