"""The one place that builds kafka-python clients: every KafkaConsumer, KafkaProducer (transactional or not) and
KafkaAdminClient of the platform is made here, from one `KafkaSettings` (bootstrap servers and security).

Callers pass the settings explicitly (an Airflow task gets them from its `KafkaHook`, the CLI and the Spark
driver from `microbatch.settings.kafka_settings()`); nothing here reads the environment or a context.
`tests/unit/test_kafka_clients.py` fails if a client class is constructed anywhere else in the package.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from microbatch.kafka.security import client_kwargs, spark_client_options
from microbatch.settings import KafkaSettings


def _common(kafka: KafkaSettings, client_id: str | None) -> dict[str, Any]:
    common: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap_servers.split(","), **client_kwargs(kafka.security)}
    if client_id is not None:
        common["client_id"] = client_id
    return common


def consumer(kafka: KafkaSettings, *, client_id: str | None = None, **config: Any) -> KafkaConsumer:
    """A KafkaConsumer of the cluster `kafka`, logged in as its security says; `config` is kafka-python's."""
    return KafkaConsumer(**_common(kafka, client_id), **config)


def producer(kafka: KafkaSettings, *, client_id: str | None = None, **config: Any) -> KafkaProducer:
    """A KafkaProducer of the cluster `kafka` (transactional when `config` has a `transactional_id`)."""
    return KafkaProducer(**_common(kafka, client_id), **config)


def admin(kafka: KafkaSettings, *, client_id: str | None = None, **config: Any) -> KafkaAdminClient:
    """A KafkaAdminClient of the cluster `kafka`."""
    return KafkaAdminClient(**_common(kafka, client_id), **config)


def spark_source_options(kafka: KafkaSettings) -> dict[str, str]:
    """The connection options of Spark's Kafka source for the cluster `kafka`: its bootstrap servers and the
    `kafka.*` security options (the same settings the kafka-python clients above log in with)."""
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, **spark_client_options(kafka.security)}
