"""Kafka security settings: one source (environment or connection), mapped to both clients."""

from __future__ import annotations

import pytest

from microbatch.errors import ConnectionSettingsError
from microbatch.kafka.security import kafka_python_kwargs, spark_kafka_options
from microbatch.settings import KafkaSecurity, kafka_security, kafka_security_variables


def test_plaintext_is_the_default_and_adds_nothing_to_spark():
    security = kafka_security({})
    assert security.security_protocol == "PLAINTEXT"
    assert spark_kafka_options(security) == {"kafka.security.protocol": "PLAINTEXT"}
    assert kafka_python_kwargs(security) == {"security_protocol": "PLAINTEXT"}


def test_sasl_scram_maps_to_both_clients():
    security = kafka_security({
        "MICROBATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "MICROBATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "MICROBATCH_KAFKA_SASL_USERNAME": "etl",
        "MICROBATCH_KAFKA_SASL_PASSWORD": 'p"w\\d',
        "MICROBATCH_KAFKA_SSL_CAFILE": "/etc/ca.pem",
    })
    assert kafka_python_kwargs(security) == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "etl",
        "sasl_plain_password": 'p"w\\d', "ssl_cafile": "/etc/ca.pem",
    }
    options = spark_kafka_options(security)
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="etl" password="p\\"w\\\\d";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == "/etc/ca.pem"


def test_sasl_plain_uses_the_plain_login_module():
    security = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u",
                             sasl_password="s")
    assert spark_kafka_options(security)["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required ")
    assert "ssl_cafile" not in kafka_python_kwargs(security)


def test_a_missing_sasl_setting_names_its_variable():
    with pytest.raises(ConnectionSettingsError) as err:
        kafka_security({"MICROBATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "MICROBATCH_KAFKA_SASL_MECHANISM": "PLAIN"})
    assert "MICROBATCH_KAFKA_SASL_USERNAME" in str(err.value)
    assert "required with security_protocol SASL_SSL" in str(err.value)


def test_an_unknown_protocol_names_its_variable():
    with pytest.raises(ConnectionSettingsError) as err:
        kafka_security({"MICROBATCH_KAFKA_SECURITY_PROTOCOL": "TLS"})
    assert "MICROBATCH_KAFKA_SECURITY_PROTOCOL" in str(err.value)


def test_the_password_never_prints():
    security = KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u",
                             sasl_password="hunter2")
    assert "hunter2" not in repr(security)
    assert "hunter2" not in str(security.model_dump())


def test_connection_extra_and_password_become_variables():
    env = kafka_security_variables({"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
                               "sasl.mechanism": "PLAIN", "sasl.username": "u"}, "pw")
    assert env == {"MICROBATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "MICROBATCH_KAFKA_SASL_MECHANISM": "PLAIN",
                   "MICROBATCH_KAFKA_SASL_USERNAME": "u", "MICROBATCH_KAFKA_SASL_PASSWORD": "pw"}
    assert kafka_security(env).sasl
    assert kafka_security_variables({"bootstrap.servers": "b:9092"}, None) == {}
