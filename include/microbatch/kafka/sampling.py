"""A few records of a live topic, for `microbatch new --from-topic`: the first ones of each partition.

The sample is read with a consumer that assigns the partitions itself (no group, nothing committed), under
`read_committed`, from each partition's earliest offset, up to `limit` records shared among the partitions that
hold some (`quotas`), and for at most `timeout_s`. An unknown or empty topic is refused in one sentence.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaError

from microbatch.errors import SpecError, TransientServiceError
from microbatch.kafka.offsets import offset_bounds, offsets_client
from microbatch.settings import KafkaSettings
from microbatch.types import TopicPartition

SAMPLE_LIMIT = 100
SAMPLE_TIMEOUT_S = 15.0
_DESCRIBE = ("or describe the records yourself: `microbatch new NAME --topic TOPIC --format json --columns "
             "id:text,amount:bigint`")


@dataclass(frozen=True)
class SampledRecord:
    """One record of the sample: where it is, and its key and value bytes as the producer sent them."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def quotas(available: Mapping[int, int], limit: int) -> dict[int, int]:
    """How many records to read from each partition (partition -> records it holds from its earliest offset): up to
    `limit` in all, shared as evenly as the partitions allow, a partition's unused share going to the others."""
    left = {p: n for p, n in available.items() if n > 0}
    taken = dict.fromkeys(left, 0)
    budget = max(limit, 0)
    while budget > 0 and left:
        share = max(budget // len(left), 1)
        for partition in sorted(left):
            if budget == 0:
                break
            step = min(share, left[partition], budget)
            taken[partition] += step
            left[partition] -= step
            budget -= step
        left = {p: n for p, n in left.items() if n > 0}
    return {p: n for p, n in taken.items() if n > 0}


def sample_topic(kafka: KafkaSettings, topic: str, limit: int = SAMPLE_LIMIT,
                 timeout_s: float = SAMPLE_TIMEOUT_S) -> list[SampledRecord]:
    """Up to `limit` records of `topic` from the earliest offsets of its partitions, in partition and offset order.
    SpecError for a topic that does not exist or holds no record; TransientServiceError if none arrived in time."""
    with offsets_client(kafka, client_id="microbatch-new", allow_auto_create_topics=False) as consumer:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            raise SpecError(f"Topic '{topic}' does not exist on the Kafka cluster at {kafka.bootstrap_servers}, so "
                            "there is nothing to sample.",
                            fix=f"Check the name, or create the topic and produce a few records first; {_DESCRIBE}.")
        earliest, latest = offset_bounds(consumer, [TopicPartition(topic, p) for p in partitions])
        wanted = quotas({tp.partition: latest[tp] - earliest[tp] for tp in earliest}, limit)
        if not wanted:
            raise SpecError(f"Topic '{topic}' holds no record to sample.",
                            fix=f"Produce a few records of the kind the pipeline will read, then run this again; "
                                f"{_DESCRIBE}.")
        stops = {p: earliest[TopicPartition(topic, p)] + n for p, n in wanted.items()}
        assigned = [KafkaTopicPartition(topic, p) for p in sorted(wanted)]
        consumer.assign(assigned)
        for ktp in assigned:
            consumer.seek(ktp, earliest[TopicPartition(topic, ktp.partition)])
        return _read(consumer, topic, stops, timeout_s)


def _read(consumer, topic: str, stops: dict[int, int], timeout_s: float) -> list[SampledRecord]:  # noqa: ANN001
    records: list[SampledRecord] = []
    open_partitions = set(stops)
    deadline = time.monotonic() + timeout_s
    while open_partitions and time.monotonic() < deadline:
        try:
            polled = consumer.poll(timeout_ms=500)
        except KafkaError as exc:
            raise TransientServiceError(f"Kafka did not return the records of {topic} ({type(exc).__name__}).",
                                        fix="Check that the cluster is up, and run this again.") from None
        for ktp, batch in polled.items():
            for record in batch:
                if record.offset < stops[ktp.partition]:
                    records.append(SampledRecord(ktp.partition, record.offset, record.key, record.value))
        for partition in list(open_partitions):
            ktp = KafkaTopicPartition(topic, partition)
            if consumer.position(ktp) >= stops[partition]:
                open_partitions.discard(partition)
                consumer.pause(ktp)
    if not records:
        raise TransientServiceError(f"No record of {topic} arrived within {timeout_s:.0f} s.",
                                    fix="Check that the cluster is up and that this login may read the topic, "
                                        "and run this again.")
    return sorted(records, key=lambda r: (r.partition, r.offset))
