"""The platform's Airflow hooks: each owns one connection, resolved once per task, as Airflow's provider hooks do.

`LedgerHook` owns the ledger database (a `Ledger`), `KafkaHook` a Kafka cluster (a `KafkaSettings`: bootstrap
servers and security). Each resolves its connection on first use (`functools.cached_property`) through the one
resolver, `microbatch.settings`: the environment still wins, and an Airflow connection is read only when its
variable is unset, and only when a task runs or the ledger page answers, never at DAG parse time. Each has
`test_connection()` -> (ok, one sentence), which never names a password.
"""

from __future__ import annotations

from functools import cached_property

from airflow.sdk import BaseHook
from kafka.errors import KafkaError
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from microbatch import settings
from microbatch.errors import MicrobatchError
from microbatch.formats.schema_registry import Registry
from microbatch.kafka import clients
from microbatch.kafka.offsets import broker_unreachable
from microbatch.ledger.database import Ledger
from microbatch.phases.pins import configured_registry
from microbatch.settings import KAFKA_CONN_ID, LEDGER_CONN_ID, ConnectionFields, KafkaSettings

_TEST_TIMEOUT_MS = 5_000  # an answer for the connection form, not a task's patience


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


class LedgerHook(BaseHook):
    """The ledger database of a task: `MICROBATCH_LEDGER_URL`, else the Airflow connection `ledger_conn_id`."""

    conn_name_attr = "ledger_conn_id"
    default_conn_name = LEDGER_CONN_ID
    conn_type = "postgres"
    hook_name = "microbatch ledger"

    def __init__(self, ledger_conn_id: str = LEDGER_CONN_ID) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger, resolved on first use and kept for the hook's life (one task)."""
        return Ledger(settings.ledger_url(connection, self.ledger_conn_id))

    def get_conn(self) -> Ledger:
        return self.ledger

    def test_connection(self) -> tuple[bool, str]:
        """(True, where it connected) after a `SELECT 1`, else (False, why): the URL's password masked."""
        try:
            ledger = self.ledger
        except MicrobatchError as exc:
            return False, str(exc)
        try:
            with ledger.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except (SQLAlchemyError, MicrobatchError) as exc:
            return False, str(exc if isinstance(exc, MicrobatchError) else ledger.unreachable(exc))
        return True, f"Connected to the ledger database at {ledger.safe_url}."


class KafkaHook(BaseHook):
    """A Kafka cluster of a task: `MICROBATCH_KAFKA_*`, else the Airflow connection `kafka_conn_id` (type kafka)."""

    conn_name_attr = "kafka_conn_id"
    default_conn_name = KAFKA_CONN_ID
    conn_type = "kafka"
    hook_name = "microbatch Kafka"

    def __init__(self, kafka_conn_id: str = KAFKA_CONN_ID) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id

    @cached_property
    def kafka(self) -> KafkaSettings:
        """The cluster's bootstrap servers and security, resolved on first use and kept for the hook's life."""
        return settings.kafka_settings(self.kafka_conn_id, connection)

    def get_conn(self) -> KafkaSettings:
        return self.kafka

    def test_connection(self) -> tuple[bool, str]:
        """(True, what it found) when an admin client logs in and lists the topics, else (False, why)."""
        try:
            kafka = self.kafka
            admin = clients.admin(kafka, client_id="microbatch-test-connection", request_timeout_ms=_TEST_TIMEOUT_MS,
                                  bootstrap_timeout_ms=_TEST_TIMEOUT_MS)
        except MicrobatchError as exc:
            return False, str(exc)
        except KafkaError:
            return False, str(broker_unreachable(kafka))
        try:
            topics = admin.list_topics()
        except KafkaError as exc:
            return False, (f"The Kafka cluster at {kafka.bootstrap_servers} did not list its topics "
                           f"({type(exc).__name__}).")
        finally:
            admin.close()
        return True, (f"Connected to the Kafka cluster at {kafka.bootstrap_servers} over "
                      f"{kafka.security.security_protocol}: {len(topics)} topics.")


def ledger_url() -> str:
    """The ledger URL: `MICROBATCH_LEDGER_URL`, else the Airflow connection `microbatch_ledger` (for the UI plugin,
    which resolves it per request)."""
    return LedgerHook().ledger.url


def kafka_settings(conn_id: str) -> KafkaSettings:
    """The Kafka cluster of `conn_id`: `MICROBATCH_KAFKA_*`, else the Airflow connection (type kafka)."""
    return KafkaHook(conn_id).kafka


def schema_registry() -> Registry:
    """The schema registry: `MICROBATCH_SCHEMA_REGISTRY_URL`, else the Airflow connection `schema_registry_default`."""
    return configured_registry(connection)


def spark_remote(conn_id: str) -> str:
    """The Spark Connect URL: `MICROBATCH_SPARK_REMOTE`, else the Airflow connection `conn_id` (spark_connect)."""
    return settings.spark_remote(conn_id, connection)
