"""What the broker knows, through kafka-python: partitions, earliest/latest offsets, group offsets.

The broker is never the truth for positions (invariant 5): the consumer group's offsets
are only written here as a mirror of the ledger, for lag tools.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from kafka import KafkaConsumer, OffsetAndMetadata
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaConfigurationError, KafkaError

from microbatch import failpoints
from microbatch.config import SourceSpec, Startup
from microbatch.errors import ConnectionSettingsError, MicrobatchError, SpecError, TransientServiceError
from microbatch.kafka import clients
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange, StartupOffsets, TopicPartition

log = logging.getLogger(__name__)
_TIMEOUT_MS = 20_000
_LOOKUP_ATTEMPTS = 4
_LOOKUP_BACKOFF_S = 3.0


def _listening(bootstrap_servers: str) -> bool:
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
            return True
        except (OSError, ValueError):
            continue
    return False


def broker_unreachable(kafka: KafkaSettings) -> MicrobatchError:
    """Why no Kafka client could be made: a refused SASL login (the broker listens) or an unreachable cluster."""
    bootstrap_servers, security = kafka.bootstrap_servers, kafka.security
    if security.sasl and _listening(bootstrap_servers):
        return ConnectionSettingsError(
            f"The Kafka broker at {bootstrap_servers} is listening but refused the SASL {security.sasl_mechanism} "
            f"login of user '{security.sasl_username}' over {security.security_protocol}.",
            fix="Check the username and password (the Kafka connection's extra and password, or "
            "MICROBATCH_KAFKA_SASL_USERNAME and MICROBATCH_KAFKA_SASL_PASSWORD) and that this listener takes "
            f"{security.security_protocol}.",
        )
    return TransientServiceError(
        f"No Kafka broker answered at {bootstrap_servers}.",
        fix="Check that the cluster is up and that the connection's host and port are right.",
    )


def require_listener(kafka: KafkaSettings) -> None:
    """Fail at once, with `broker_unreachable`'s sentence, when no bootstrap server accepts a TCP connection: a
    closed port is refused in milliseconds, where a kafka-python client waits its 30-s bootstrap timeout before it
    says the same. For the CLI's own producers (`generate`); a task's client keeps the wait, which rides over a
    broker that is restarting."""
    if not _listening(kafka.bootstrap_servers):
        raise broker_unreachable(kafka)


@contextmanager
def offsets_client(
    kafka: KafkaSettings, isolation_level: str = "read_committed", group_id: str | None = None,
    client_id: str = "microbatch-planner", **settings: Any,
) -> Iterator[KafkaConsumer]:
    """A consumer for metadata and offset lookups (or reads it assigns itself: `kafka/sampling.py`); it never
    subscribes. `settings`: more of kafka-python's consumer settings."""
    try:
        consumer = clients.consumer(
            kafka,
            client_id=client_id,
            group_id=group_id,
            enable_auto_commit=False,
            isolation_level=isolation_level,
            request_timeout_ms=30_000,
            **settings,
        )
    except KafkaConfigurationError as exc:
        raise ConnectionSettingsError(f"The Kafka client settings are invalid: {exc}.") from None
    except KafkaError:
        raise broker_unreachable(kafka) from None
    skip_bootstrap_backoff(consumer)
    try:
        yield consumer
    finally:
        consumer.close(autocommit=False)


def skip_bootstrap_backoff(client: KafkaConsumer) -> None:
    """Let the client's first request for topic metadata go out at once, not `retry_backoff_ms` (100 ms) later.

    kafka-python 3.0 counts the metadata request of its bootstrap (in the consumer's constructor, which asks for
    no topic) as a refresh to back off from, so the first lookup of a topic's partitions waited 0.1 s (measured:
    0.107-0.114 s per plan, whatever `retry_backoff_ms` says, as its cluster metadata does not get that setting).
    Kafka's Java client stopped backing off after a bootstrap in KAFKA-4024: a bootstrap that succeeded is no
    failure. On a kafka-python without these attributes this does nothing, and the wait comes back."""
    cluster = getattr(client, "_cluster", None)
    if isinstance(getattr(cluster, "_last_refresh_ms", None), int | float):
        cluster._last_refresh_ms = 0  # type: ignore[union-attr]


def source_partitions(consumer: KafkaConsumer, source: SourceSpec) -> list[TopicPartition]:
    """The partitions a pipeline's source reads now: its listed topics, or every topic matching its pattern."""
    found, _ = discover_source(consumer, source.topics, source.topic_pattern)
    return found


def discover_partitions(consumer: KafkaConsumer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of the given topics; an unknown topic is a spec error."""
    found, missing = discover_source(consumer, topics)
    if missing:
        raise SpecError(
            f"Topic '{missing[0]}' does not exist on the Kafka cluster.",
            fix="Create it, or fix source.topics in the pipeline spec.",
        )
    return found


def discover_source(
    consumer: KafkaConsumer, topics: Iterable[str] = (), pattern: str | None = None
) -> tuple[list[TopicPartition], list[str]]:
    """Partition discovery, run on every plan: the partitions of the listed topics, or of every topic whose
    name fully matches `pattern` (as Flink and Spark match a topic regex), and the listed topics that are missing.
    """
    if pattern is not None:
        try:
            names = consumer.topics()
        except KafkaError as exc:
            raise TransientServiceError(f"Kafka did not list its topics ({type(exc).__name__}).") from None
        regex = re.compile(pattern)
        topics = sorted(name for name in names if regex.fullmatch(name) and not name.startswith("__"))
    found: list[TopicPartition] = []
    missing: list[str] = []
    for topic in topics:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            missing.append(topic)
            continue
        found.extend(TopicPartition(topic, p) for p in sorted(partitions))
    return found, missing


def read_source(
    kafka: KafkaSettings,
    source: SourceSpec,
    known: Mapping[TopicPartition, int],
    *,
    group_id: str,
    failpoint: failpoints.Point | None = None,
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int], StartupOffsets]:
    """Every lookup a plan makes on the broker, on one client: discover the partitions, read their earliest and
    latest offsets, and what the startup mode needs for partitions the ledger has never seen (`known`: the
    ledger's positions; the startup modes apply on the first plan only). A listed topic that is missing and was
    never read is a SpecError. `failpoint` names a test hold point between the two offset lookups."""
    with offsets_client(kafka, source.isolation_level) as consumer:
        partitions, missing = discover_source(consumer, source.topics or (), source.topic_pattern)
        earliest, latest = (offset_bounds(consumer, partitions, failpoint=failpoint) if partitions
                            else ({}, {}))
        unknown = [topic for topic in missing if topic not in {tp.topic for tp in known}]
        if unknown:
            raise SpecError(
                f"Topic '{unknown[0]}' does not exist on the Kafka cluster.",
                fix="Create it, or fix source.topics in the pipeline spec.",
            )
        new = [tp for tp in partitions if tp not in known] if not known else []  # startup modes: first plan only
        looked_up = startup_lookups(
            kafka, consumer, new,
            group_id=group_id if needs_group_offsets(source, new) else None,
            timestamp_ms=source.startup.timestamp if needs_offsets_for_time(source, new) else None,
        )
    return earliest, latest, looked_up


def needs_group_offsets(source: SourceSpec, new_partitions: Iterable[TopicPartition]) -> bool:
    """Whether resolving the new partitions of a first plan needs the takeover group's committed offsets."""
    mode = source.startup.mode
    if mode is Startup.GROUP_OFFSETS:
        return any(True for _ in new_partitions)
    if mode is Startup.SPECIFIC_OFFSETS:
        listed = source.startup.specific_offsets
        return any((tp.topic, tp.partition) not in listed for tp in new_partitions)
    return False


def needs_offsets_for_time(source: SourceSpec, new_partitions: Iterable[TopicPartition]) -> bool:
    """Whether resolving the new partitions needs offsets-for-times."""
    return source.startup.mode is Startup.TIMESTAMP and any(True for _ in new_partitions)


def startup_lookups(
    kafka: KafkaSettings,
    consumer: KafkaConsumer,
    partitions: list[TopicPartition],
    *,
    group_id: str | None,
    timestamp_ms: int | None,
) -> StartupOffsets:
    """The broker's answers the startup modes need, for new partitions only: the committed offsets of
    `group_id` (read, never trusted for recovery of known partitions) and the offsets for `timestamp_ms`."""
    committed: dict[TopicPartition, int | None] = {}
    for_time: dict[TopicPartition, int | None] = {}
    if group_id is not None and partitions:
        offsets = read_group_offsets(kafka, group_id)
        committed = {tp: offsets.get(tp) for tp in partitions}
    if timestamp_ms is not None and partitions:
        for_time = offsets_for_time(consumer, partitions, timestamp_ms)
    return StartupOffsets(committed=committed, for_time=for_time)


def offsets_for_time(
    consumer: KafkaConsumer, partitions: Iterable[TopicPartition], millis: int
) -> dict[TopicPartition, int | None]:
    """The first offset of each partition whose record timestamp is at or after `millis` (epoch ms);
    None for a partition with no such record. The only place that asks Kafka for offsets by time."""
    wanted = list(partitions)
    if not wanted:
        return {}
    try:
        found = consumer.offsets_for_times(
            {KafkaTopicPartition(tp.topic, tp.partition): millis for tp in wanted}, timeout_ms=_TIMEOUT_MS
        )
    except KafkaError as exc:
        raise TransientServiceError(f"Kafka did not return offsets for times ({type(exc).__name__}).") from None
    hits = {TopicPartition(ktp.topic, ktp.partition): hit for ktp, hit in found.items()}
    return {tp: None if hits.get(tp) is None else hits[tp].offset for tp in wanted}


def read_group_offsets(kafka: KafkaSettings, group_id: str) -> dict[TopicPartition, int]:
    """The committed offsets of a consumer group, through the admin client (partitions without one are absent)."""
    try:
        admin = clients.admin(kafka, client_id="microbatch-planner")
    except KafkaError:
        raise broker_unreachable(kafka) from None
    try:
        answer = admin.list_group_offsets({group_id: None})
    except KafkaError as exc:
        raise TransientServiceError(
            f"Kafka did not return the offsets of group {group_id} ({type(exc).__name__})."
        ) from None
    finally:
        admin.close()
    return {
        TopicPartition(ktp.topic, ktp.partition): meta.offset
        for ktp, meta in answer.get(group_id, {}).items()
        if meta is not None and meta.offset is not None and meta.offset >= 0
    }


TimeOffsets = dict[TopicPartition, int | None]


def requested_ranges(
    kafka: KafkaSettings,
    isolation_level: str,
    topic: str,
    partitions: list[int] | Literal["all"],
    start: int | datetime,
    end: int | datetime | Literal["latest"],
) -> list[OffsetRange]:
    """A backfill's request as one offset range per partition, every lookup it needs made on one client: the
    wanted partitions, their earliest and latest offsets, and times resolved to offsets. Refused (SpecError) for a
    partition that does not exist, an end beyond the latest offset, a start before the earliest offset Kafka
    still holds, or a start time after every record of the topic."""
    with offsets_client(kafka, isolation_level) as consumer:
        wanted = _wanted_partitions(consumer, topic, partitions)
        earliest, latest = offset_bounds(consumer, wanted)
        starts, ends = _resolve_times(consumer, start, end, wanted)
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    for tp in wanted:
        first, last = _partition_bounds(start, end, tp, latest[tp], starts, ends)
        if first < earliest[tp] and first < last:
            raise SpecError(
                f"Backfill range {tp} [{first}, {last}) starts before the earliest offset Kafka still holds "
                f"({earliest[tp]}): those records were deleted by retention.",
                fix=f"Start at {earliest[tp]} or later.",
            )
        bounds[tp] = (first, last)
    if starts is not None and wanted and all(starts[tp] is None for tp in wanted):
        raise SpecError(
            f"Backfill parameter 'start': no record of {topic} has a timestamp at or after "
            f"{start}, so the time resolves to no offset.",
            fix="Pick an earlier start time, or give offsets.",
        )
    return [OffsetRange(tp.topic, tp.partition, s, e) for tp, (s, e) in sorted(bounds.items()) if e > s]


def _wanted_partitions(
    consumer: KafkaConsumer, topic: str, partitions: list[int] | Literal["all"]
) -> list[TopicPartition]:
    known = discover_partitions(consumer, [topic])
    wanted = known if partitions == "all" else [TopicPartition(topic, p) for p in partitions]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise SpecError(
            f"Backfill parameter 'partitions': {', '.join(str(tp) for tp in unknown)} does not exist.",
            fix=f"{topic} has partitions 0..{len(known) - 1}.",
        )
    return wanted


def _resolve_times(
    consumer: KafkaConsumer, start: int | datetime, end: int | datetime | Literal["latest"],
    wanted: list[TopicPartition],
) -> tuple[TimeOffsets | None, TimeOffsets | None]:
    """The offsets of a time range's start and end (None for an offset range, and for end 'latest')."""
    if not isinstance(start, datetime):
        return None, None
    starts = offsets_for_time(consumer, wanted, epoch_ms(start))
    if end == "latest":
        return starts, None
    return starts, offsets_for_time(consumer, wanted, epoch_ms(end))  # type: ignore[arg-type]


def _partition_bounds(
    start: int | datetime, end: int | datetime | Literal["latest"], tp: TopicPartition, latest: int,
    starts: TimeOffsets | None, ends: TimeOffsets | None,
) -> tuple[int, int]:
    """[start, end) of one partition; a time with no record at or after it resolves to the latest offset."""
    if starts is not None:
        first = starts[tp]
        last = None if ends is None else ends[tp]
        return (latest if first is None else first), (latest if last is None else last)
    first = int(start)  # type: ignore[arg-type]
    last = latest if end == "latest" else int(end)  # type: ignore[arg-type]
    if last > latest:
        raise SpecError(
            f"Backfill parameter 'end': {last} is beyond the latest offset of {tp} ({latest}).",
            fix="Use an end at or below it, or end 'latest' to go up to each partition's end.",
        )
    return first, last


def epoch_ms(value: datetime) -> int:
    """Kafka timestamps are epoch milliseconds; a time without a zone is taken as UTC."""
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)


def offset_bounds(
    consumer: KafkaConsumer, partitions: list[TopicPartition], failpoint: failpoints.Point | None = None,
    attempts: int = _LOOKUP_ATTEMPTS,
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """The earliest and latest offsets; under read_committed the latest is the last stable offset.

    On a cluster a partition's leader can move (or its broker die) during the lookup: the client refreshes
    its metadata and asks the new leader; a lookup that still fails is tried again, `attempts` times in all.
    Either way the log says in one sentence which partition's leader moved. `failpoint` names a test hold
    point between the two lookups."""
    kafka_tps = [KafkaTopicPartition(tp.topic, tp.partition) for tp in partitions]
    before = _leaders(consumer, kafka_tps)
    for attempt in range(1, attempts + 1):
        try:
            earliest = consumer.beginning_offsets(kafka_tps, timeout_ms=_TIMEOUT_MS)
            if failpoint is not None:
                failpoint.hit()
            latest = consumer.end_offsets(kafka_tps, timeout_ms=_TIMEOUT_MS)
            break
        except KafkaError as exc:
            if attempt == attempts:
                raise TransientServiceError(f"Kafka did not return offsets ({type(exc).__name__}) after "
                                            f"{attempts} attempts.") from None
            log.warning("Kafka did not return the offsets (%s: a partition leader moved or a broker is down); "
                        "retried (attempt %s of %s)", type(exc).__name__, attempt + 1, attempts)
            time.sleep(_LOOKUP_BACKOFF_S)
    for moved in leader_moves(before, _leaders(consumer, kafka_tps)):
        log.warning("%s; the offset lookup was retried on the new leader", moved)
    return (
        {TopicPartition(tp.topic, tp.partition): offset for tp, offset in earliest.items()},
        {TopicPartition(tp.topic, tp.partition): offset for tp, offset in latest.items()},
    )


def _leaders(consumer: KafkaConsumer, kafka_tps: list[KafkaTopicPartition]) -> dict[str, int | None]:
    """The broker that leads each partition, in the client's current metadata (kafka-python keeps it on the
    consumer's network client; it refreshes it after a NOT_LEADER answer or a lost connection)."""
    cluster = consumer._client.cluster  # no public accessor for leaders
    return {f"{tp.topic}[{tp.partition}]": cluster.leader_for_partition(tp) for tp in kafka_tps}


def leader_moves(before: Mapping[str, int | None], after: Mapping[str, int | None]) -> list[str]:
    """One sentence per partition whose leader changed between two metadata views."""
    return [f"the leader of {name} moved from broker {before[name]} to broker {after[name]}"
            for name in sorted(after) if name in before and before[name] is not None
            and after[name] is not None and after[name] != before[name]]


def mirror_group_offsets(
    kafka: KafkaSettings, group_id: str, positions: Mapping[TopicPartition, int]
) -> bool:
    """Best effort: write the ledger positions as the group's committed offsets, for lag tools.

    Flink's ON_CHECKPOINTS commit mode: it runs only after the ledger commit, a failure is a
    warning and never fails the batch, and these offsets are never read back for recovery.
    """
    offsets = {
        KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(offset, "microbatch", -1)
        for tp, offset in positions.items()
    }
    try:
        admin = clients.admin(kafka, client_id="microbatch-mirror", request_timeout_ms=_TIMEOUT_MS)
        try:
            errors = admin.alter_group_offsets(group_id, offsets)
        finally:
            admin.close()
    except KafkaError as exc:
        log.warning("could not mirror offsets to group %s (%s); the ledger is unaffected", group_id,
                    type(exc).__name__)
        return False
    failed = {f"{ktp.topic}[{ktp.partition}]": error.__name__ for ktp, error in errors.items()
              if error is not None and error.__name__ != "NoError"}
    if failed:
        log.warning("could not mirror offsets to group %s for %s; the ledger is unaffected", group_id, failed)
        return False
    log.info("mirrored %s position(s) to consumer group %s", len(offsets), group_id)
    return True
