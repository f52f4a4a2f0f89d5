"""The Kafka sink's publishing: its outbox rows -> its topic, exactly once for `read_committed` readers.

Flink does this with a two-phase-commit producer. Here the outbox rows were committed with the
ledger, so publishing only has to be idempotent:

1. `init_transactions()` with a stable `transactional_id` per sink fences any older producer
   and aborts its open transaction (a zombie's records never become visible);
2. the last sequence really published is read from the topic's committed tail
   (`read_committed`; each record carries its outbox sequence in a header);
3. the rows after it are sent in transactions of bounded size;
4. after each `commit_transaction()` the progress is recorded in Postgres, for operators only.

A crash at any point leaves either a committed transaction (found by step 2 next time) or an
aborted one (invisible), so nothing is lost or duplicated. The publish phase (`phases/publish.py`) holds the
sink's lock and hands the outbox (`Outbox`); `KafkaTopic.publish` calls `publish_outbox`.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError, ProducerFencedError

from microbatch import failpoints
from microbatch.config import KafkaSink
from microbatch.errors import SpecError
from microbatch.kafka import clients
from microbatch.kafka.offsets import skip_bootstrap_backoff
from microbatch.settings import KafkaSettings
from microbatch.sinks.contexts import Outbox, PublishRun

log = logging.getLogger("microbatch.phases.publish")  # lines of the publish phase's own log
SEQ_HEADER = "microbatch.seq"
CORRECTION_HEADER = "microbatch.correction"
RETRACTION_HEADER = "microbatch.retraction"
_TAIL_WINDOW = 64
_FAILOVER_ATTEMPTS = 4
_FAILOVER_BACKOFF_S = 3.0
_FLUSH_TIMEOUT_S = 30.0
_COMMIT_TIMEOUT_S = 15.0
"""The records are flushed before the commit, so a coordinator that lives ends the transaction in milliseconds;
past this the commit is taken as lost with its coordinator (`_commit_within`)."""
BEFORE_COMMIT = failpoints.point("publish.before_commit")  # Kafka transaction open
AFTER_COMMIT = failpoints.point("publish.after_commit")  # Kafka committed, progress not recorded
BETWEEN_TRANSACTIONS = failpoints.point("publish.between_transactions")


def record_headers(sink: KafkaSink, seq: int, value: dict) -> list[tuple[str, bytes]]:
    """A published record's headers: its outbox sequence, the correction and retraction marks of a backfill or a
    replay, then the spec's `headers`, each the text of its column in the row (none for a null)."""
    headers = [(SEQ_HEADER, str(seq).encode())]
    if value.get("correction"):
        headers.append((CORRECTION_HEADER, b"1"))  # a backfill or a replay changed what was published
    if value.get("retraction"):
        headers.append((RETRACTION_HEADER, b"1"))  # a replay no longer gives this row
    for name, column in sink.headers.items():
        found = value.get(column)
        if found is not None:
            headers.append((name, (found if isinstance(found, str) else json.dumps(found)).encode()))
    return headers


def _seq_of(headers: list[tuple[str, bytes]] | None) -> int | None:
    for name, value in headers or ():
        if name == SEQ_HEADER:
            return int(value.decode())
    return None


def last_published_seq(kafka: KafkaSettings, topic: str) -> int:
    """The highest outbox sequence in the topic's committed records (0 if none).

    Transactions commit atomically and sequences are sent in order, so the highest sequence
    among the committed tails of all partitions is the last one published, and every lower
    one is published too. Reads only the tail of each partition, widening if it finds no
    data record there (markers of many small transactions).
    """
    consumer = clients.consumer(kafka, client_id="microbatch-publisher-tail", isolation_level="read_committed",
                                enable_auto_commit=False, group_id=None)
    skip_bootstrap_backoff(consumer)
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise SpecError(f"The output topic '{topic}' does not exist.",
                            fix="Run `microbatch migrate`, which creates it as the spec says.")
        tps = [KafkaTopicPartition(topic, p) for p in sorted(partitions)]
        begins = consumer.beginning_offsets(tps)
        ends = consumer.end_offsets(tps)
        best = 0
        for tp in tps:
            begin, end = begins[tp], ends[tp]
            window = _TAIL_WINDOW
            while end > begin:
                start = max(begin, end - window)
                found = _max_seq_between(consumer, tp, start, end)
                if found is not None:
                    best = max(best, found)
                    break
                if start == begin:
                    break
                window *= 4
        return best
    finally:
        consumer.close()


def _max_seq_between(consumer: KafkaConsumer, tp: KafkaTopicPartition, start: int, end: int) -> int | None:
    consumer.assign([tp])
    consumer.seek(tp, start)
    best: int | None = None
    deadline = time.monotonic() + 30
    while consumer.position(tp) < end and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                seq = _seq_of(record.headers)
                if seq is not None:
                    best = seq if best is None else max(best, seq)
    return best


def publish_outbox(sink: KafkaSink, outbox: Outbox, kafka: KafkaSettings) -> PublishRun:
    """Publish every row of `outbox` that the topic does not hold yet, starting a new producer after a broker
    failover; what the producers did. See the module docstring."""
    run = PublishRun()
    for attempt in range(1, _FAILOVER_ATTEMPTS + 1):
        try:
            _publish_session(sink, outbox, kafka, run)
            break
        except KafkaError as exc:
            if isinstance(exc, ProducerFencedError) or attempt == _FAILOVER_ATTEMPTS:
                raise
            # A broker or the transaction coordinator failed over under the open transaction: the client
            # gives up on it (or the coordinator aborted it). A new producer with the same transactional_id
            # finishes or aborts whatever the old one left, and the topic's committed tail says where to go on.
            log.warning("publish %s: the transaction on %s failed in a broker failover (%s); starting a new one "
                        "from the topic's committed tail (attempt %s of %s)", sink.name, sink.topic,
                        type(exc).__name__, attempt + 1, _FAILOVER_ATTEMPTS)
            time.sleep(_FAILOVER_BACKOFF_S)
    return run


def _publish_session(sink: KafkaSink, outbox: Outbox, kafka: KafkaSettings, run: PublishRun) -> None:
    """One producer: fence, read the committed tail, send the rest in transactions; `run` keeps count."""
    producer = clients.producer(kafka, client_id=f"microbatch-publisher-{sink.name}",
                                transactional_id=sink.transactional_id, acks="all", linger_ms=5)
    try:
        producer.init_transactions()  # fences older producers with this id and aborts their open transaction
        last = run.last = last_published_seq(kafka, sink.topic)
        if run.resumed_after is None:
            run.resumed_after = last
        log.info("publish %s: the topic %s holds sequences up to %s (read_committed tail); outbox ends at %s",
                 sink.name, sink.topic, last, outbox.highest)
        while True:
            rows = outbox.pending(last, sink.transaction_size)
            if not rows:
                break
            if rows[0][0] != last + 1:
                raise RuntimeError(f"outbox of {sink.name} has a gap after sequence {last}")
            producer.begin_transaction()
            for seq, key, value in rows:
                headers = record_headers(sink, seq, value)
                producer.send(sink.topic, key=(key or "").encode(), value=json.dumps(value, sort_keys=True).encode(),
                              headers=headers)
            producer.flush(timeout=_FLUSH_TIMEOUT_S)
            BEFORE_COMMIT.hit()
            _commit_within(producer, _COMMIT_TIMEOUT_S)
            last = run.last = rows[-1][0]
            run.transactions += 1
            AFTER_COMMIT.hit()
            outbox.record_progress(last)
            log.info("  transaction %s: sequences %s..%s committed", run.transactions, rows[0][0], last)
            BETWEEN_TRANSACTIONS.hit()
    finally:
        producer.close(timeout=10)


def _commit_within(producer: KafkaProducer, timeout_s: float) -> None:
    """`commit_transaction()`, bounded. kafka-python waits on the commit without a timeout, and when the
    transaction coordinator dies under it, it can wait forever (seen with 3.0.12: the EndTxn is never sent to
    the new coordinator). Past `timeout_s` this raises KafkaTimeoutError, and the caller starts a new
    producer with the same transactional_id: its init_transactions() bumps the epoch, which fences this one
    and has the coordinator finish or abort the transaction; the topic's committed tail then says which."""
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            producer.commit_transaction()
        except BaseException as exc:  # handed to the caller's thread below
            errors.append(exc)

    committer = threading.Thread(target=commit, name="microbatch-commit", daemon=True)
    committer.start()
    committer.join(timeout_s)
    if committer.is_alive():
        raise KafkaTimeoutError(f"the transaction commit did not complete within {timeout_s:.0f}s")
