"""Where each connection comes from: the environment first, then the lookup (Airflow's connections), with
the one-sentence errors of each case; nothing is written to the environment."""

from __future__ import annotations

import os

import pytest

from microbatch import settings
from microbatch.errors import ConnectionSettingsError
from microbatch.kafka.security import client_kwargs
from microbatch.settings import ConnectionFields, KafkaSecurity, KafkaSettings

SASL = {"bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "etl"}


@pytest.fixture(autouse=True)
def no_connection_variables(monkeypatch):
    for name in list(os.environ):
        if name.startswith("MICROBATCH_KAFKA_") or name in (settings.LEDGER_URL_ENV, settings.SPARK_REMOTE_ENV,
                                                            settings.SCHEMA_REGISTRY_URL_ENV):
            monkeypatch.delenv(name)


def lookup_of(**connections: ConnectionFields):
    return connections.get


def test_ledger_url_from_env_first_then_the_connection(monkeypatch):
    lookup = lookup_of(microbatch_ledger=ConnectionFields(host="db", port=5433, login="u", password="p", schema="l"))
    assert settings.ledger_url(lookup) == "postgresql+psycopg://u:p@db:5433/l"
    monkeypatch.setenv(settings.LEDGER_URL_ENV, "postgresql+psycopg://e:e@env:1/e")
    assert settings.ledger_url(lookup) == "postgresql+psycopg://e:e@env:1/e"
    assert settings.ledger_url() == "postgresql+psycopg://e:e@env:1/e"


def test_ledger_url_errors_say_what_to_set():
    with pytest.raises(ConnectionSettingsError, match="no local stack is running: MICROBATCH_LEDGER_URL is not set"):
        settings.ledger_url()
    with pytest.raises(ConnectionSettingsError, match="neither MICROBATCH_LEDGER_URL nor the Airflow connection "
                                                      "'microbatch_ledger' exists"):
        settings.ledger_url(lookup_of())


def test_kafka_from_the_connection_with_its_security_and_no_environment_written():
    before = dict(os.environ)
    kafka = settings.kafka_settings("kafka_default", lookup_of(kafka_default=ConnectionFields(extra=SASL,
                                                                                              password="s3cret")))
    assert dict(os.environ) == before
    assert kafka.bootstrap_servers == "b1:9093,b2:9093"
    assert kafka.security.sasl and kafka.security.sasl_username == "etl"
    assert kafka.env() == {
        "MICROBATCH_KAFKA_BOOTSTRAP": "b1:9093,b2:9093", "MICROBATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "MICROBATCH_KAFKA_SASL_MECHANISM": "PLAIN", "MICROBATCH_KAFKA_SASL_USERNAME": "etl",
        "MICROBATCH_KAFKA_SASL_PASSWORD": "s3cret",
    }
    assert "s3cret" not in repr(kafka)
    # A child process that gets env() resolves the same settings from its environment alone.
    assert settings.kafka_security(kafka.env()) == kafka.security


def test_a_security_variable_that_is_set_wins_over_the_connection(monkeypatch):
    monkeypatch.setenv("MICROBATCH_KAFKA_SASL_USERNAME", "other")
    kafka = settings.kafka_settings("k", lookup_of(k=ConnectionFields(extra=SASL, password="s3cret")))
    assert kafka.security.sasl_username == "other"
    assert kafka.security.sasl_password.get_secret_value() == "s3cret"


def test_kafka_from_env_ignores_the_connection(monkeypatch):
    monkeypatch.setenv(settings.BOOTSTRAP_ENV, "envhost:9092")
    kafka = settings.kafka_settings("k", lookup_of(k=ConnectionFields(extra=SASL, password="s3cret")))
    assert kafka == KafkaSettings("envhost:9092")
    assert kafka.env() == {"MICROBATCH_KAFKA_BOOTSTRAP": "envhost:9092"}


def test_kafka_errors_say_what_to_set():
    with pytest.raises(ConnectionSettingsError, match="no local stack is running: MICROBATCH_KAFKA_BOOTSTRAP is not"):
        settings.kafka_settings()
    with pytest.raises(ConnectionSettingsError, match="neither MICROBATCH_KAFKA_BOOTSTRAP nor the Airflow connection "
                                                      "'k' exists"):
        settings.kafka_settings("k", lookup_of())
    with pytest.raises(ConnectionSettingsError, match="The Airflow connection 'k' has no bootstrap servers"):
        settings.kafka_settings("k", lookup_of(k=ConnectionFields()))
    bad = ConnectionFields(extra={"bootstrap.servers": "b:1", "security.protocol": "TLS"})
    with pytest.raises(ConnectionSettingsError, match="MICROBATCH_KAFKA_SECURITY_PROTOCOL is invalid"):
        settings.kafka_settings("k", lookup_of(k=bad))


def test_clients_log_in_with_the_settings_they_are_given(monkeypatch):
    kafka = settings.kafka_settings("k", lookup_of(k=ConnectionFields(extra=SASL, password="s3cret")))
    assert client_kwargs(KafkaSecurity()) == {}
    assert client_kwargs(kafka.security)["sasl_plain_password"] == "s3cret"
    assert client_kwargs(settings.kafka_security()) == {}
    monkeypatch.setenv("MICROBATCH_KAFKA_SECURITY_PROTOCOL", "SSL")
    assert client_kwargs(settings.kafka_security()) == {"security_protocol": "SSL"}


def test_spark_remote_from_env_then_the_connection_url(monkeypatch):
    assert settings.spark_remote("sc", lookup_of(sc=ConnectionFields(url="sc://h:15002/;token=t"))) == \
        "sc://h:15002/;token=t"
    with pytest.raises(ConnectionSettingsError, match="neither MICROBATCH_SPARK_REMOTE nor the Airflow connection"):
        settings.spark_remote("sc", lookup_of())
    with pytest.raises(ConnectionSettingsError, match="'sc' is not a usable Spark Connect connection: it needs a host"):
        settings.spark_remote("sc", lookup_of(sc=ConnectionFields()))
    with pytest.raises(ConnectionSettingsError, match="MICROBATCH_SPARK_REMOTE is not set"):
        settings.spark_remote("sc")
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "sc://env:1")
    assert settings.spark_remote("sc", lookup_of()) == "sc://env:1"


def test_schema_registry_url_from_env_first_then_the_connections_url_then_its_host(monkeypatch):
    by_url = lookup_of(schema_registry_default=ConnectionFields(
        host="ignored", port=1, extra={"url": "https://reg.example:8443/apis/ccompat/v7/"}))
    assert settings.schema_registry_url(by_url) == "https://reg.example:8443/apis/ccompat/v7"
    by_host = lookup_of(schema_registry_default=ConnectionFields(host="reg", port=8081))
    assert settings.schema_registry_url(by_host) == "http://reg:8081"
    with_path = lookup_of(other=ConnectionFields(host="https://reg/apis/ccompat/v7", port=8443))
    assert settings.schema_registry_url(with_path, "other") == "https://reg:8443/apis/ccompat/v7"
    scheme = lookup_of(schema_registry_default=ConnectionFields(host="reg", port=443, schema="https"))
    assert settings.schema_registry_url(scheme) == "https://reg:443"
    monkeypatch.setenv(settings.SCHEMA_REGISTRY_URL_ENV, "http://127.0.0.1:8080/apis/ccompat/v7")
    for lookup in (None, by_url, by_host, lookup_of()):
        assert settings.schema_registry_url(lookup) == "http://127.0.0.1:8080/apis/ccompat/v7"


def test_schema_registry_credentials_go_into_the_url_and_never_into_what_is_shown():
    conn = ConnectionFields(host="reg", port=8081, login="etl", password="p@ss/w:rd")
    url = settings.schema_registry_url(lookup_of(schema_registry_default=conn))
    assert url == "http://etl:p%40ss%2Fw%3Ard@reg:8081"
    assert settings.redact_url(url) == "http://reg:8081"
    assert settings.redact_url("https://u:secret@[::1]:8443/apis/ccompat/v7?token=t#x") == \
        "https://[::1]:8443/apis/ccompat/v7"
    assert settings.redact_url("not a url") == "(unparseable)"
    given = ConnectionFields(extra={"url": "https://own:creds@reg/api"}, login="other", password="x")
    assert settings.schema_registry_url(lookup_of(schema_registry_default=given)) == "https://own:creds@reg/api"


def test_schema_registry_errors_say_what_to_set_or_start():
    with pytest.raises(ConnectionSettingsError, match="no local one is running: MICROBATCH_SCHEMA_REGISTRY_URL is "
                                                      "not set") as no_lookup:
        settings.schema_registry_url()
    assert "make registry" in str(no_lookup.value)
    with pytest.raises(ConnectionSettingsError, match="neither MICROBATCH_SCHEMA_REGISTRY_URL nor the Airflow "
                                                      "connection 'schema_registry_default' exists") as missing:
        settings.schema_registry_url(lookup_of())
    assert "make registry" in str(missing.value)
    with pytest.raises(ConnectionSettingsError, match="'schema_registry_default' names no schema registry"):
        settings.schema_registry_url(lookup_of(schema_registry_default=ConnectionFields(port=8081)))
