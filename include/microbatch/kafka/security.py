"""Kafka security settings (SSL, SASL_PLAINTEXT, SASL_SSL), mapped once to both clients:
kafka-python's keyword arguments and the `kafka.*` options of Spark's Kafka source.

Where the settings come from is `microbatch.settings` (`kafka_settings`: the environment, else the
Kafka connection); they travel with the cluster's `KafkaSettings`, passed explicitly to
`microbatch.kafka.clients`, which builds every client. They reach spark-submit through its environment
(`KafkaSettings.env`), never through its arguments.
"""

from __future__ import annotations

from typing import Any

from microbatch.settings import KafkaSecurity

LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def kafka_python_kwargs(security: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for kafka-python's KafkaConsumer, KafkaProducer and KafkaAdminClient."""
    kwargs: dict[str, Any] = {"security_protocol": security.security_protocol}
    if security.sasl:
        kwargs.update(sasl_mechanism=security.sasl_mechanism, sasl_plain_username=security.sasl_username,
                      sasl_plain_password=security.sasl_password.get_secret_value())  # type: ignore[union-attr]
    if security.ssl and security.ssl_cafile:
        kwargs["ssl_cafile"] = security.ssl_cafile
    return kwargs


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(security: KafkaSecurity) -> dict[str, str]:
    """The `kafka.*` options of Spark's Kafka source (passed to its consumers as is)."""
    options = {"kafka.security.protocol": security.security_protocol}
    if security.sasl:
        assert security.sasl_mechanism and security.sasl_username and security.sasl_password
        options["kafka.sasl.mechanism"] = security.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{LOGIN_MODULES[security.sasl_mechanism]} required "
            f"username={_jaas_quote(security.sasl_username)} "
            f"password={_jaas_quote(security.sasl_password.get_secret_value())};"
        )
    if security.ssl and security.ssl_cafile:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = security.ssl_cafile
    return options


def client_kwargs(security: KafkaSecurity) -> dict[str, Any]:
    """kafka-python security arguments for `security`; empty for plaintext."""
    return {} if security.security_protocol == "PLAINTEXT" else kafka_python_kwargs(security)


def spark_client_options(security: KafkaSecurity) -> dict[str, str]:
    """Spark Kafka source security options for `security`; empty for plaintext."""
    return {} if security.security_protocol == "PLAINTEXT" else spark_kafka_options(security)
