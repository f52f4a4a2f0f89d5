"""The publish phase: outbox rows -> a Kafka topic, exactly once for `read_committed` readers.

For each publishing sink of the pipeline (`sinks/registry.publishing`), under the sink's advisory lock (one live
publisher per sink), the phase reads the outbox's bounds from the ledger and asks the sink to `publish` the rows
the topic lacks (`Publisher.publish`; the Kafka sink's transactional send is `sinks/kafka_publish.py`), handing it the
ledger's reads of the pending rows and records of progress; then it records the publish's seconds per batch and
returns the result. A crash at any point is finished by the next publish, which starts from the topic's tail.
"""

from __future__ import annotations

import time
from functools import partial

from microbatch.config import PipelineSpec, SinkSpec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, publish_lock
from microbatch.phases.results import PublishResult
from microbatch.settings import KafkaSettings
from microbatch.sinks.base import Outbox
from microbatch.sinks.capabilities import Publisher
from microbatch.sinks.registry import sink_for


def _pending(ledger: Ledger, pipeline_id: int, sink: str, after: int, limit: int) -> list[tuple[int, str, dict]]:
    with ledger.transaction() as session:
        return repo.pending_outbox(session, pipeline_id, sink, after, limit)


def _record_progress(ledger: Ledger, pipeline_id: int, sink: str, last_seq: int) -> None:
    with ledger.transaction() as session:
        repo.record_publish_progress(session, pipeline_id, sink, last_seq)


def pending_bounds(ledger: Ledger, pipeline_id: int, sink: str) -> tuple[int, int]:
    """(recorded progress, highest outbox sequence) of one sink."""
    with ledger.transaction() as session:
        return repo.publish_bounds(session, pipeline_id, sink)


def publish_sink(spec: PipelineSpec, sink: SinkSpec, ledger: Ledger, kafka: KafkaSettings) -> PublishResult:
    """Publish every outbox row of `sink` that the topic does not hold yet; see the module docstring."""
    started = time.monotonic()
    publisher = sink_for(sink)
    assert isinstance(publisher, Publisher), f"sink {sink.name} publishes nothing"
    with ledger.transaction() as session:
        pipeline = repo.get_pipeline(session, spec.name)
        pipeline_id = pipeline.id if pipeline else None
    if pipeline_id is None:
        return PublishResult(sink.name, publisher.published_topic, 0, 0, 0, 0, 0.0)
    with publish_lock(ledger.url, pipeline_id, sink.name):  # one live publisher per sink; see publish_lock
        return _publish_locked(publisher, sink.name, ledger, kafka, pipeline_id, started)


def _publish_locked(sink: Publisher, name: str, ledger: Ledger, kafka: KafkaSettings, pipeline_id: int,
                    started: float) -> PublishResult:
    topic = sink.published_topic
    progress, highest = pending_bounds(ledger, pipeline_id, name)
    if progress >= highest:
        # Progress is written only after a Kafka commit, so it never runs ahead of the topic.
        return PublishResult(name, topic, progress, progress, 0, 0, time.monotonic() - started)

    outbox = Outbox(highest, pending=partial(_pending, ledger, pipeline_id, name),
                    record_progress=partial(_record_progress, ledger, pipeline_id, name))
    run = sink.publish(outbox, kafka)
    assert run.resumed_after is not None
    seconds = time.monotonic() - started
    if run.last > run.resumed_after:
        _record_publish_seconds(ledger, pipeline_id, name, run.resumed_after, run.last, seconds)
    return PublishResult(name, topic, run.resumed_after, run.last, run.last - run.resumed_after,
                         run.transactions, seconds)


def _record_publish_seconds(ledger: Ledger, pipeline_id: int, sink: str, after: int, last: int,
                            seconds: float) -> None:
    """Add this publish's seconds to `timings.publish_s` of each batch whose outbox rows it carried (for the
    ledger page's step chart; a publish that carried several batches counts for each)."""
    with ledger.transaction() as session:
        repo.add_publish_seconds(session, pipeline_id, sink, after, last, seconds)

