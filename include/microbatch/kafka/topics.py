"""Output topics: which exist, and creating the missing ones as the spec declares them (`microbatch migrate`).

The plan refuses a batch whose output topic is missing (`phases/plan.check_output_topics`), before anything is
written, so a batch is never committed with nowhere to publish it; `migrate` creates each missing topic with the
sink's `partitions`, `replication_factor` and `topic_config`, the broker's defaults where the spec leaves them
unset (CreateTopics with -1, KIP-464). An existing topic is never changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from microbatch.config import OutputTopic, PipelineSpec
from microbatch.kafka import clients
from microbatch.kafka.offsets import offsets_client
from microbatch.settings import KafkaSettings

BROKER_DEFAULT = -1
"""CreateTopics' "the broker's default" for the partitions or the replication factor."""


def existing_topics(kafka: KafkaSettings, names: Iterable[str]) -> set[str]:
    """Which of `names` the cluster has (its metadata, as any client sees it). A cluster that refuses the login
    or does not answer is one sentence (`offsets.broker_unreachable`), as for the source."""
    with offsets_client(kafka, client_id="microbatch-topics") as consumer:
        known = consumer.topics()
    return set(names) & known


def create_topics(kafka: KafkaSettings, topics: list[OutputTopic], timeout_s: float = 30) -> list[str]:
    """Create those of `topics` the cluster lacks and wait until each has its partitions' leaders; the names
    created (a topic another client created meanwhile counts as existing)."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    missing = [t for t in topics if t.name not in existing_topics(kafka, [t.name for t in topics])]
    if not missing:
        return []
    admin = clients.admin(kafka, client_id="microbatch-topics")
    created = []
    try:
        for topic in missing:
            new = NewTopic(topic.name, topic.partitions or BROKER_DEFAULT, topic.replication_factor or BROKER_DEFAULT,
                           topic_configs=dict(topic.config))
            try:
                admin.create_topics([new])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                continue
    finally:
        admin.close()
    _wait_for_leaders(kafka, missing, timeout_s)
    return created


def _wait_for_leaders(kafka: KafkaSettings, topics: list[OutputTopic], timeout_s: float) -> None:
    """Until every partition of `topics` has a leader (at least `partitions` of them when declared), so that the
    first produce does not race the creation."""
    consumer = clients.consumer(kafka, client_id="microbatch-topics")
    deadline = time.monotonic() + timeout_s
    try:
        for topic in topics:
            while len(consumer.partitions_for_topic(topic.name) or ()) < (topic.partitions or 1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {topic.name} has no partition leaders after {timeout_s:.0f}s")
                time.sleep(0.2)
                consumer.topics()  # refreshes the metadata
    finally:
        consumer.close()


def output_topics(spec: PipelineSpec) -> dict[str, list[tuple[str, OutputTopic]]]:
    """The output topics of the spec's sinks, as (sink name, topic) by Kafka connection id."""
    by_connection: dict[str, list[tuple[str, OutputTopic]]] = {}
    for sink in spec.sinks:
        topic = sink.output_topic
        if topic is not None:
            by_connection.setdefault(topic.connection, []).append((sink.name, topic))
    return by_connection


def missing_output_topics(spec: PipelineSpec, settings_for: Callable[[str], KafkaSettings]) -> list[tuple[str, str]]:
    """(sink name, topic) of each output topic of the spec that its cluster lacks."""
    missing = []
    for connection, topics in output_topics(spec).items():
        found = existing_topics(settings_for(connection), [topic.name for _, topic in topics])
        missing += [(sink, topic.name) for sink, topic in topics if topic.name not in found]
    return missing


def migrate_output_topics(spec: PipelineSpec, settings_for: Callable[[str], KafkaSettings]) -> list[str]:
    """Create the spec's missing output topics (`microbatch migrate`); one line per topic created."""
    done = []
    for connection, topics in output_topics(spec).items():
        declared = {topic.name: topic for _, topic in topics}
        for name in create_topics(settings_for(connection), list(declared.values())):
            partitions = declared[name].partitions
            done.append(f"created topic {name} ({partitions} partition(s))" if partitions
                        else f"created topic {name} (the broker's default partitions)")
    return done
