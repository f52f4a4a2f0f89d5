"""Kafka security settings (SSL, SASL_PLAINTEXT, SASL_SSL), mapped once to both clients:
kafka-python's keyword arguments and the `kafka.*` options of Spark's Kafka source.

The settings come from `MICROBATCH_KAFKA_*` environment variables, which the Airflow task sets
from the Kafka connection's extra (`security.protocol`, `sasl.mechanism`, `sasl.username`,
`ssl.cafile`) and password. They reach spark-submit through its environment, never through its
arguments, and the password is a `SecretStr`, so it prints as `**********`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, model_validator

from microbatch.errors import ConnectionSettingsError, first_validation_error

ENV_PREFIX = "MICROBATCH_KAFKA_"
FIELDS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile")
EXTRA_KEYS = {"security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
              "sasl.username": "sasl_username", "sasl.password": "sasl_password", "ssl.cafile": "ssl_cafile"}
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaSecurity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    """A PEM file of the CA certificates that signed the brokers' certificates."""

    @model_validator(mode="after")
    def _complete(self) -> KafkaSecurity:
        if self.security_protocol.startswith("SASL_"):
            for name in ("sasl_mechanism", "sasl_username", "sasl_password"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name}: required with security_protocol {self.security_protocol}")
        return self

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")


def from_env(environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The settings in `MICROBATCH_KAFKA_SECURITY_PROTOCOL`, `..._SASL_MECHANISM`, `..._SASL_USERNAME`,
    `..._SASL_PASSWORD` and `..._SSL_CAFILE`; an invalid value names its variable."""
    environ = os.environ if environ is None else environ
    values = {f: environ[ENV_PREFIX + f.upper()] for f in FIELDS if environ.get(ENV_PREFIX + f.upper())}
    try:
        return KafkaSecurity.model_validate(values)
    except ValidationError as exc:
        field, message = first_validation_error(exc)
        raise ConnectionSettingsError(
            f"Kafka security setting {ENV_PREFIX}{field.upper()} is invalid: {message}.",
            fix="Set it in the environment or in the Kafka connection's extra (security.protocol, sasl.mechanism, "
            "sasl.username, ssl.cafile; the password in the connection's password field).",
        ) from None


def env_from_connection(extra: Mapping[str, Any], password: str | None) -> dict[str, str]:
    """The `MICROBATCH_KAFKA_*` variables for a Kafka connection's extra and password."""
    env = {ENV_PREFIX + field.upper(): str(extra[key]) for key, field in EXTRA_KEYS.items() if extra.get(key)}
    if password and ENV_PREFIX + "SASL_PASSWORD" not in env:
        env[ENV_PREFIX + "SASL_PASSWORD"] = password
    return env


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


def client_kwargs() -> dict[str, Any]:
    """kafka-python security arguments from the environment (empty for a plaintext cluster)."""
    security = from_env()
    return {} if security.security_protocol == "PLAINTEXT" else kafka_python_kwargs(security)


def spark_client_options() -> dict[str, str]:
    """Spark Kafka source security options from the environment (empty for a plaintext cluster)."""
    security = from_env()
    return {} if security.security_protocol == "PLAINTEXT" else spark_kafka_options(security)
