"""Connections as objects (issue 42): one module builds every kafka-python client from one `KafkaSettings`, no
context variable carries Kafka security, and the Airflow hooks resolve their connection once and test it without
naming a secret. The boundary is read from the source (ast), so it holds for code no test runs."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from microbatch import settings
from microbatch.kafka import clients
from microbatch.settings import ConnectionFields, KafkaSecurity, KafkaSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "include" / "microbatch"
CLIENTS = PACKAGE / "kafka" / "clients.py"
CLIENT_CLASSES = {"KafkaConsumer", "KafkaProducer", "KafkaAdminClient"}
PASSWORD = "s3cret-Pa55"
SASL = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="etl",
                     sasl_password=PASSWORD)


def _called_name(node: ast.Call) -> str | None:
    return getattr(node.func, "id", None) or getattr(node.func, "attr", None)


def test_kafka_clients_are_constructed_in_one_module_only():
    """A KafkaConsumer, KafkaProducer or KafkaAdminClient built anywhere but `kafka/clients.py` would log in by
    its own rules (or not at all): build it with `microbatch.kafka.clients` from the cluster's `KafkaSettings`."""
    found = sorted(f"{path.relative_to(ROOT)}:{node.lineno} builds {_called_name(node)}"
                   for path in PACKAGE.rglob("*.py") if path != CLIENTS
                   for node in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(node, ast.Call) and _called_name(node) in CLIENT_CLASSES)
    assert found == []
    built = {_called_name(node) for node in ast.walk(ast.parse(CLIENTS.read_text()))
             if isinstance(node, ast.Call) and _called_name(node) in CLIENT_CLASSES}
    assert built == CLIENT_CLASSES


def test_no_context_variable_carries_connections():
    """Kafka security travels with `KafkaSettings`, passed explicitly; no ContextVar scope decides how a client
    logs in."""
    kafka_side = [*(PACKAGE / "kafka").rglob("*.py"), PACKAGE / "settings.py"]
    users = sorted({str(path.relative_to(ROOT)) for path in kafka_side if "ContextVar" in path.read_text()}
                   | {str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py")
                      if "security_scope" in path.read_text()})
    assert users == []


def test_every_client_gets_the_bootstrap_servers_and_the_security_of_its_settings(monkeypatch):
    made: list[tuple[str, dict]] = []
    for name in CLIENT_CLASSES:
        monkeypatch.setattr(clients, name, lambda _name=name, **kwargs: made.append((_name, kwargs)))
    kafka = KafkaSettings("b1:9093,b2:9093", SASL)
    clients.consumer(kafka, client_id="c", group_id=None)
    clients.producer(kafka, client_id="p", transactional_id="t")
    clients.admin(kafka)
    assert [name for name, _ in made] == ["KafkaConsumer", "KafkaProducer", "KafkaAdminClient"]
    for _, kwargs in made:
        assert kwargs["bootstrap_servers"] == ["b1:9093", "b2:9093"]
        assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
        assert kwargs["sasl_plain_username"] == "etl"
        assert kwargs["sasl_plain_password"] == PASSWORD
    assert made[1][1]["transactional_id"] == "t"
    assert "client_id" not in made[2][1]
    clients.consumer(KafkaSettings("b:1"))
    assert made[-1][1] == {"bootstrap_servers": ["b:1"]}  # plaintext: no security arguments at all


def test_the_spark_source_gets_the_same_cluster():
    options = clients.spark_source_options(KafkaSettings("b1:9093", SASL))
    assert options["kafka.bootstrap.servers"] == "b1:9093"
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert clients.spark_source_options(KafkaSettings("b:1")) == {"kafka.bootstrap.servers": "b:1"}


@pytest.fixture
def no_connection_variables(monkeypatch):
    for name in list(os.environ):
        if name.startswith("MICROBATCH_KAFKA_") or name == settings.LEDGER_URL_ENV:
            monkeypatch.delenv(name)


def test_hooks_resolve_their_connection_once(monkeypatch, no_connection_variables):
    from microbatch.airflow import hooks

    looked_up: list[str] = []
    fields = {"microbatch_ledger": ConnectionFields(host="db", port=5433, login="u", password=PASSWORD, schema="l"),
              "kafka_x": ConnectionFields(extra={"bootstrap.servers": "b:9092"})}
    monkeypatch.setattr(hooks, "connection", lambda conn_id: looked_up.append(conn_id) or fields.get(conn_id))
    ledger_hook, kafka_hook = hooks.LedgerHook(), hooks.KafkaHook("kafka_x")
    assert looked_up == []  # built without I/O, as a DAG file may build it
    for _ in range(3):
        assert ledger_hook.get_conn().url == f"postgresql+psycopg://u:{PASSWORD}@db:5433/l"
        assert kafka_hook.get_conn() == KafkaSettings("b:9092")
    assert looked_up == ["microbatch_ledger", "kafka_x"]
    assert PASSWORD not in repr(ledger_hook.ledger)


def test_test_connection_says_why_without_the_secret(monkeypatch, no_connection_variables):
    from microbatch.airflow import hooks

    monkeypatch.setenv(settings.LEDGER_URL_ENV, f"postgresql+psycopg://u:{PASSWORD}@127.0.0.1:1/ledger")
    ok, message = hooks.LedgerHook().test_connection()
    assert not ok
    assert "Cannot use the ledger database at" in message
    assert PASSWORD not in message

    monkeypatch.setenv(settings.BOOTSTRAP_ENV, "127.0.0.1:1")
    monkeypatch.setenv("MICROBATCH_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("MICROBATCH_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("MICROBATCH_KAFKA_SASL_USERNAME", "etl")
    monkeypatch.setenv("MICROBATCH_KAFKA_SASL_PASSWORD", PASSWORD)
    ok, message = hooks.KafkaHook().test_connection()
    assert not ok
    assert "127.0.0.1:1" in message
    assert PASSWORD not in message

    monkeypatch.delenv(settings.BOOTSTRAP_ENV)
    monkeypatch.setattr(hooks, "connection", lambda conn_id: None)
    ok, message = hooks.KafkaHook("nowhere").test_connection()
    assert not ok
    assert "'nowhere'" in message
