"""What the broker knows, through kafka-python: partitions, earliest/latest offsets, group offsets.

The broker is never the truth for positions (invariant 5): the consumer group's offsets
are only written here as a mirror of the ledger, for lag tools.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from kafka import KafkaConsumer, OffsetAndMetadata
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaConfigurationError, KafkaError

from microbatch.errors import ConnectionSettingsError, SpecError, TransientServiceError
from microbatch.planning import TopicPartition

log = logging.getLogger(__name__)
BOOTSTRAP_ENV = "MICROBATCH_KAFKA_BOOTSTRAP"
_TIMEOUT_MS = 20_000


def bootstrap_from_env() -> str:
    servers = os.environ.get(BOOTSTRAP_ENV)
    if not servers:
        raise ConnectionSettingsError(
            f"The Kafka cluster is not configured: {BOOTSTRAP_ENV} is not set.",
            fix="Set it to HOST:PORT[,HOST:PORT], or create the Airflow connection named in source.connection.",
        )
    return servers


@contextmanager
def offsets_client(
    bootstrap_servers: str, isolation_level: str = "read_committed", group_id: str | None = None
) -> Iterator[KafkaConsumer]:
    """A consumer used only for metadata and offset lookups; it never subscribes."""
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers.split(","),
            group_id=group_id,
            enable_auto_commit=False,
            isolation_level=isolation_level,
            request_timeout_ms=30_000,
            client_id="microbatch-planner",
        )
    except KafkaConfigurationError as exc:
        raise ConnectionSettingsError(f"The Kafka client settings are invalid: {exc}.") from None
    except KafkaError:
        raise TransientServiceError(
            f"No Kafka broker answered at {bootstrap_servers}.",
            fix="Check that the cluster is up and that the connection's host and port are right.",
        ) from None
    try:
        yield consumer
    finally:
        consumer.close(autocommit=False)


def discover_partitions(consumer: KafkaConsumer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of the given topics; an unknown topic is a spec error."""
    found: list[TopicPartition] = []
    for topic in topics:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise SpecError(
                f"Topic '{topic}' does not exist on the Kafka cluster.",
                fix="Create it, or fix source.topics in the pipeline spec.",
            )
        found.extend(TopicPartition(topic, p) for p in sorted(partitions))
    return found


def offset_bounds(
    consumer: KafkaConsumer, partitions: list[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """The earliest and latest offsets; under read_committed the latest is the last stable offset."""
    kafka_tps = [KafkaTopicPartition(tp.topic, tp.partition) for tp in partitions]
    try:
        earliest = consumer.beginning_offsets(kafka_tps, timeout_ms=_TIMEOUT_MS)
        latest = consumer.end_offsets(kafka_tps, timeout_ms=_TIMEOUT_MS)
    except KafkaError as exc:
        raise TransientServiceError(f"Kafka did not return offsets ({type(exc).__name__}).") from None
    return (
        {TopicPartition(tp.topic, tp.partition): offset for tp, offset in earliest.items()},
        {TopicPartition(tp.topic, tp.partition): offset for tp, offset in latest.items()},
    )


def mirror_group_offsets(
    bootstrap_servers: str, group_id: str, positions: Mapping[TopicPartition, int]
) -> bool:
    """Best effort: write the ledger positions as the group's committed offsets, for lag tools."""
    try:
        with offsets_client(bootstrap_servers, group_id=group_id) as consumer:
            consumer.commit(
                {
                    KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(offset, "microbatch", -1)
                    for tp, offset in positions.items()
                }
            )
    except (KafkaError, TransientServiceError) as exc:
        log.warning("could not mirror offsets to group %s (%s); the ledger is unaffected", group_id, exc)
        return False
    return True
