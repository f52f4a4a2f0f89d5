"""Where each connection comes from: the environment first, then the Airflow connection. The one resolver.

Every process resolves its connections here: the CLI and the Spark driver from the environment only
(`lookup=None`), Airflow tasks and the UI plugin with the lookup of `microbatch.airflow.hooks`, which
turns an Airflow connection into `ConnectionFields`. Nothing here imports Airflow, and nothing here
writes to `os.environ`: what a child process needs is returned (`KafkaSettings.env`) for the caller to
pass on. Every failure is one `ConnectionSettingsError` sentence naming the variable and the connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, model_validator

from microbatch.errors import ConnectionSettingsError, first_validation_error

LEDGER_URL_ENV = "MICROBATCH_LEDGER_URL"
BOOTSTRAP_ENV = "MICROBATCH_KAFKA_BOOTSTRAP"
SPARK_REMOTE_ENV = "MICROBATCH_SPARK_REMOTE"
SCHEMA_REGISTRY_URL_ENV = "MICROBATCH_SCHEMA_REGISTRY_URL"
KAFKA_SECURITY_PREFIX = "MICROBATCH_KAFKA_"
LEDGER_CONN_ID = "microbatch_ledger"
KAFKA_CONN_ID = "kafka_default"
SCHEMA_REGISTRY_CONN_ID = "schema_registry_default"
SPARK_CONNECT_DEFAULT_PORT = 15002  # Spark Connect's default gRPC port
_SECURITY_FIELDS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile")
_SECURITY_EXTRA_KEYS = {"security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
                        "sasl.username": "sasl_username", "sasl.password": "sasl_password",
                        "ssl.cafile": "ssl_cafile"}


@dataclass(frozen=True)
class ConnectionFields:
    """What settings reads of a connection (an Airflow connection, as `airflow.hooks.connection` gives it)."""

    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = None
    schema: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    url: str | None = None
    """The URL the connection type's provider hook builds from it (a spark_connect connection's sc:// URL);
    None when the type has none or the connection cannot make one."""


Lookup = Callable[[str], ConnectionFields | None]
"""conn_id -> its fields, or None when no such connection exists."""


class KafkaSecurity(BaseModel):
    """SSL / SASL settings of a Kafka cluster; the password is a `SecretStr`, so it prints as `**********`."""

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


@dataclass(frozen=True)
class KafkaSettings:
    """A Kafka cluster: its bootstrap servers and how to log in."""

    bootstrap_servers: str
    security: KafkaSecurity = field(default_factory=KafkaSecurity)

    def env(self) -> dict[str, str]:
        """The variables from which a child process (spark-submit's driver) resolves these same settings."""
        values = {name: getattr(self.security, name) for name in self.security.model_fields_set}
        return {BOOTSTRAP_ENV: self.bootstrap_servers, **{
            KAFKA_SECURITY_PREFIX + name.upper(): value.get_secret_value() if isinstance(value, SecretStr) else value
            for name, value in values.items() if value is not None
        }}


def ledger_url(lookup: Lookup | None = None, conn_id: str = LEDGER_CONN_ID) -> str:
    """The ledger URL: `MICROBATCH_LEDGER_URL`, else (with a lookup) the connection `microbatch_ledger`."""
    if os.environ.get(LEDGER_URL_ENV):
        return os.environ[LEDGER_URL_ENV]
    if lookup is None:
        raise ConnectionSettingsError(
            f"No ledger database is configured and no local stack is running: {LEDGER_URL_ENV} is not set.",
            fix="Start the local stack with `make demo` (or `make airflow`), or set it to "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB.",
        )
    conn = lookup(conn_id)
    if conn is None:
        raise ConnectionSettingsError(
            f"The ledger database is not configured: neither {LEDGER_URL_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=f"Create the connection '{conn_id}' (type postgres) or set {LEDGER_URL_ENV}.",
        )
    return (
        f"postgresql+psycopg://{conn.login or ''}:{conn.password or ''}@{conn.host or '127.0.0.1'}:"
        f"{conn.port or 5432}/{conn.schema or 'postgres'}"
    )


def kafka_settings(conn_id: str = KAFKA_CONN_ID, lookup: Lookup | None = None) -> KafkaSettings:
    """The Kafka cluster: `MICROBATCH_KAFKA_BOOTSTRAP` and the `MICROBATCH_KAFKA_*` security variables, else
    (with a lookup) the connection `conn_id`'s extra (`bootstrap.servers`, `security.protocol`, ...) and
    password, each security variable that is set winning over the connection's value."""
    if os.environ.get(BOOTSTRAP_ENV):
        return KafkaSettings(os.environ[BOOTSTRAP_ENV], kafka_security())
    if lookup is None:
        raise ConnectionSettingsError(
            f"No Kafka cluster is configured and no local stack is running: {BOOTSTRAP_ENV} is not set.",
            fix="Start the local stack with `make demo` (or `make airflow`), or set it to HOST:PORT[,HOST:PORT].",
        )
    conn = lookup(conn_id)
    if conn is None:
        raise ConnectionSettingsError(
            f"The Kafka cluster is not configured: neither {BOOTSTRAP_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=f"Create the connection '{conn_id}' (type kafka, extra bootstrap.servers) or set {BOOTSTRAP_ENV}.",
        )
    servers = conn.extra.get("bootstrap.servers") or (f"{conn.host}:{conn.port}" if conn.host else None)
    if not servers:
        raise ConnectionSettingsError(
            f"The Airflow connection '{conn_id}' has no bootstrap servers.",
            fix="Set its extra to {\"bootstrap.servers\": \"HOST:PORT\"}.",
        )
    variables = {**kafka_security_variables(conn.extra, conn.password), **_security_environ(os.environ)}
    return KafkaSettings(str(servers), kafka_security(variables))


def kafka_security(environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The settings in `MICROBATCH_KAFKA_SECURITY_PROTOCOL`, `..._SASL_MECHANISM`, `..._SASL_USERNAME`,
    `..._SASL_PASSWORD` and `..._SSL_CAFILE` (of `os.environ` by default); an invalid value names its variable."""
    values = {name.removeprefix(KAFKA_SECURITY_PREFIX).lower(): value
              for name, value in _security_environ(os.environ if environ is None else environ).items()}
    try:
        return KafkaSecurity.model_validate(values)
    except ValidationError as exc:
        name, message = first_validation_error(exc)
        raise ConnectionSettingsError(
            f"Kafka security setting {KAFKA_SECURITY_PREFIX}{name.upper()} is invalid: {message}.",
            fix="Set it in the environment or in the Kafka connection's extra (security.protocol, sasl.mechanism, "
            "sasl.username, ssl.cafile; the password in the connection's password field).",
        ) from None


def kafka_security_variables(extra: Mapping[str, Any], password: str | None) -> dict[str, str]:
    """The `MICROBATCH_KAFKA_*` variables that a Kafka connection's extra and password stand for."""
    variables = {KAFKA_SECURITY_PREFIX + name.upper(): str(extra[key])
                 for key, name in _SECURITY_EXTRA_KEYS.items() if extra.get(key)}
    if password and KAFKA_SECURITY_PREFIX + "SASL_PASSWORD" not in variables:
        variables[KAFKA_SECURITY_PREFIX + "SASL_PASSWORD"] = password
    return variables


def _security_environ(environ: Mapping[str, str]) -> dict[str, str]:
    names = [KAFKA_SECURITY_PREFIX + name.upper() for name in _SECURITY_FIELDS]
    return {name: environ[name] for name in names if environ.get(name)}


def spark_remote_set() -> bool:
    """Whether `MICROBATCH_SPARK_REMOTE` names a Spark Connect server: what `spark.mode: auto` resolves by."""
    return bool(os.environ.get(SPARK_REMOTE_ENV))


def spark_remote(conn_id: str, lookup: Lookup | None = None) -> str:
    """The Spark Connect URL: `MICROBATCH_SPARK_REMOTE`, else (with a lookup) the sc:// URL of the connection
    `conn_id` (type spark_connect)."""
    if os.environ.get(SPARK_REMOTE_ENV):
        return os.environ[SPARK_REMOTE_ENV]
    create = (f"Create the connection '{conn_id}' (type spark_connect, host sc://HOST, port "
              f"{SPARK_CONNECT_DEFAULT_PORT}) or set {SPARK_REMOTE_ENV}=sc://HOST:PORT.")
    if lookup is None:
        raise ConnectionSettingsError(
            f"The Spark Connect server is not configured: {SPARK_REMOTE_ENV} is not set.", fix=create)
    conn = lookup(conn_id)
    if conn is None:
        raise ConnectionSettingsError(
            f"The Spark Connect server is not configured: neither {SPARK_REMOTE_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=create,
        )
    if not conn.url:
        raise ConnectionSettingsError(
            f"The Airflow connection '{conn_id}' is not a usable Spark Connect connection: it needs a host and no "
            "path.",
            fix=f"Set its host to sc://HOST (or HOST) and its port to the server's ({SPARK_CONNECT_DEFAULT_PORT} by "
            "default).",
        )
    return conn.url


def schema_registry_url(lookup: Lookup | None = None, conn_id: str = SCHEMA_REGISTRY_CONN_ID) -> str:
    """The root URL of a schema registry's Confluent-compatible API: `MICROBATCH_SCHEMA_REGISTRY_URL`, else (with a
    lookup) the connection `conn_id`: its extra `url`, else its host (`HOST`, `http[s]://HOST[/PATH]`) and port;
    its login and password, where set, become the URL's user info (basic authentication). Show it with
    `redact_url`: it may hold that password."""
    if os.environ.get(SCHEMA_REGISTRY_URL_ENV):
        return os.environ[SCHEMA_REGISTRY_URL_ENV]
    start = ("Start the local one with `make registry` (then `source .cache/devstack/env.sh`), or set it to the "
             "registry's Confluent-compatible API, e.g. http://HOST:PORT/apis/ccompat/v7 for Apicurio.")
    if lookup is None:
        raise ConnectionSettingsError(
            f"No schema registry is configured and no local one is running: {SCHEMA_REGISTRY_URL_ENV} is not set.",
            fix=start)
    conn = lookup(conn_id)
    if conn is None:
        raise ConnectionSettingsError(
            f"The schema registry is not configured: neither {SCHEMA_REGISTRY_URL_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=f"Create the connection '{conn_id}' (type http, extra {{\"url\": \"http://HOST:PORT/PATH\"}}, or host "
            f"and port) or set {SCHEMA_REGISTRY_URL_ENV}. {start}")
    url = _registry_url_of(conn)
    if url is None:
        raise ConnectionSettingsError(
            f"The Airflow connection '{conn_id}' names no schema registry: it has neither an extra url nor a host.",
            fix="Set its extra to {\"url\": \"http://HOST:PORT/PATH\"}, or its host and port.")
    return url


def _registry_url_of(conn: ConnectionFields) -> str | None:
    """The registry URL a connection stands for, with its login and password as user info; None without a URL or
    host."""
    base = str(conn.extra.get("url") or "").strip() or (conn.host or "").strip()
    if not base:
        return None
    scheme = conn.schema if conn.schema in ("http", "https") else "http"
    parts = urlsplit(base if "://" in base else f"{scheme}://{base}")
    netloc = parts.netloc
    if conn.port and parts.port is None and not conn.extra.get("url"):
        netloc = f"{netloc}:{conn.port}"
    if conn.login and "@" not in netloc:
        password = f":{quote(conn.password, safe='')}" if conn.password else ""
        netloc = f"{quote(conn.login, safe='')}{password}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), parts.query, ""))


def redact_url(url: str) -> str:
    """`url` as logs and errors show it: scheme, host, port and path, without user info, query or fragment."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return "(unparseable)"
    if not parts.scheme or not host:
        return "(unparseable)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path}"


METRICS_ENV_PREFIX = "MICROBATCH_METRICS_"


class MetricsSettings(BaseModel):
    """Where `microbatch metrics` sends the ledger's metrics: a Prometheus scrape endpoint on `host:port`
    (loopback unless told otherwise), or an OTLP collector (the OpenTelemetry SDK's own `OTEL_EXPORTER_OTLP_*`
    variables say where) every `interval_s` seconds."""

    model_config = ConfigDict(extra="forbid")
    exporter: Literal["prometheus", "otlp"] = "prometheus"
    host: str = "127.0.0.1"
    port: int = 9464
    interval_s: float = 15.0


def metrics_settings(environ: Mapping[str, str] | None = None) -> MetricsSettings:
    """`MICROBATCH_METRICS_EXPORTER`, `_HOST`, `_PORT` and `_INTERVAL_S`; a bad value is one sentence."""
    environ = os.environ if environ is None else environ
    values = {key.removeprefix(METRICS_ENV_PREFIX).lower(): value for key, value in environ.items()
              if key.startswith(METRICS_ENV_PREFIX)}
    try:
        return MetricsSettings(**values)
    except ValidationError as exc:
        field_name, message = first_validation_error(exc)
        raise ConnectionSettingsError(
            f"{METRICS_ENV_PREFIX}{field_name.upper()} is not valid: {message}.",
            fix="Set MICROBATCH_METRICS_EXPORTER to prometheus or otlp, and MICROBATCH_METRICS_PORT to a port "
                "number.") from None
