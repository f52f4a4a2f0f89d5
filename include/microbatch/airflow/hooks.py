"""Airflow connections -> `microbatch.settings`: the lookup that the settings resolvers take inside Airflow.

The environment still wins (settings reads it first); an Airflow connection is read only when its
variable is unset, and only when a task runs or the ledger page answers, never at DAG parse time.
"""

from __future__ import annotations

from airflow.sdk import BaseHook

from microbatch import settings
from microbatch.settings import ConnectionFields, KafkaSettings


def connection(conn_id: str) -> ConnectionFields | None:
    """The Airflow connection `conn_id` as settings reads it, or None when it does not exist. A spark_connect
    connection carries the sc:// URL that the Spark provider's `SparkConnectHook` builds from it."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # not found, or no connection source in this process: settings says it is not configured
        return None
    url = _spark_connect_url(conn_id) if conn.conn_type == "spark_connect" else None
    return ConnectionFields(host=conn.host, port=conn.port, login=conn.login, password=conn.password,
                            schema=conn.schema, extra=conn.extra_dejson, url=url)


def _spark_connect_url(conn_id: str) -> str | None:
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except (AttributeError, TypeError, ValueError):  # no host (the hook calls host.find), or a path in the URL
        return None


def ledger_url() -> str:
    """The ledger URL: `MICROBATCH_LEDGER_URL`, else the Airflow connection `microbatch_ledger`."""
    return settings.ledger_url(connection)


def kafka_settings(conn_id: str) -> KafkaSettings:
    """The Kafka cluster of `conn_id`: `MICROBATCH_KAFKA_*`, else the Airflow connection (type kafka)."""
    return settings.kafka_settings(conn_id, connection)


def spark_remote(conn_id: str) -> str:
    """The Spark Connect URL: `MICROBATCH_SPARK_REMOTE`, else the Airflow connection `conn_id` (spark_connect)."""
    return settings.spark_remote(conn_id, connection)
