"""The plan phase: read the ledger and the broker, decide the next batch, insert it.

The decision itself is the pure `planning.plan_batch`; this module only does the I/O
around it. The pipeline row is locked FOR UPDATE, so two planners never race, and an open
batch is always reused: a retry never plans new ranges while an earlier batch is open.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from microbatch.config import OnDataLoss, PipelineSpec
from microbatch.errors import SpecError
from microbatch.kafka.offsets import discover_source, offset_bounds, offsets_client, startup_lookups
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.ledger.models import BatchState
from microbatch.planning import data_loss_at_read, lost_ranges, needs_group_offsets, needs_offsets_for_time, plan_batch
from microbatch.types import OffsetRange, Plan, StartupOffsets, TopicPartition

log = logging.getLogger(__name__)


@dataclass
class PlanOutcome:
    batch_id: int | None
    reused: bool
    ranges: list[OffsetRange]
    plan: Plan | None
    latest: dict[TopicPartition, int]
    seconds: float

    @property
    def records(self) -> int:
        return sum(r.size for r in self.ranges)


def plan_next_batch(
    spec: PipelineSpec, ledger_url: str, bootstrap_servers: str, airflow_run_id: str | None = None
) -> PlanOutcome:
    """Reuse the open batch, or plan and insert a new one; batch_id is None when there is nothing to read.

    Discovery runs on every plan (listed topics, or the topic pattern). Partitions the ledger has never
    seen start by `source.startup`, and their start is pinned in the ledger in the same transaction, so
    the mode applies once. Every fresh plan records the lag of each partition.
    """
    started = time.monotonic()
    earliest, latest, looked_up = _read_broker(spec, ledger_url, bootstrap_servers)
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        reused = _reuse_open_batch(session, pipeline.id, earliest, spec.source.on_data_loss)
        if reused is not None:
            return PlanOutcome(reused[0], True, reused[1], None, latest, time.monotonic() - started)
        positions = repo.read_positions(session, pipeline.id)
        waited = repo.seconds_since_last_batch(session, pipeline.id)
        plan = plan_batch(positions, earliest, latest, spec.source, looked_up, waited)
        repo.pin_new_positions(session, pipeline.id, {tp: plan.starts[tp] for tp in plan.new_partitions})
        batch_id = None
        if plan.ranges or plan.gaps:
            batch = repo.insert_batch(session, pipeline, plan, airflow_run_id=airflow_run_id)
            batch.timings = {"plan_s": round(time.monotonic() - started, 3)}
            batch_id = batch.id
        repo.record_lag(session, pipeline.id, batch_id, plan, latest)
        if batch_id is not None and batch_id % repo.LAG_PRUNE_EVERY == 0:
            pruned = repo.prune_lag_snapshots(session, pipeline.id)
            if pruned:
                log.info("pruned %s lag snapshot(s) older than %s days", pruned, repo.LAG_RETENTION_DAYS)
        if plan.disappeared_topics:
            log.warning("topic(s) %s no longer exist or match; their ledger positions are kept",
                        ", ".join(plan.disappeared_topics))
        return PlanOutcome(batch_id, False, list(plan.ranges), plan, latest, time.monotonic() - started)


def _read_broker(
    spec: PipelineSpec, ledger_url: str, bootstrap_servers: str
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int], StartupOffsets]:
    """Discover the partitions, read their earliest and latest offsets, and what the startup mode needs for
    partitions the ledger has never seen; a listed topic that is missing and was never read is a SpecError."""
    source = spec.source
    with offsets_client(bootstrap_servers, source.isolation_level) as consumer:
        partitions, missing = discover_source(consumer, source.topics or (), source.topic_pattern)
        earliest, latest = offset_bounds(consumer, partitions) if partitions else ({}, {})
        with transaction(ledger_url) as session:
            pipeline = repo.ensure_pipeline(session, spec)
            known = repo.read_positions(session, pipeline.id)
        unknown = [topic for topic in missing if topic not in {tp.topic for tp in known}]
        if unknown:
            raise SpecError(
                f"Topic '{unknown[0]}' does not exist on the Kafka cluster.",
                fix="Create it, or fix source.topics in the pipeline spec.",
            )
        new = [tp for tp in partitions if tp not in known] if not known else []  # startup modes: first plan only
        group_id = source.startup.group_id or spec.group_id
        looked_up = startup_lookups(
            bootstrap_servers, consumer, new,
            group_id=group_id if needs_group_offsets(source, new) else None,
            timestamp_ms=source.startup.timestamp if needs_offsets_for_time(source, new) else None,
        )
    return earliest, latest, looked_up


def _reuse_open_batch(
    session: Session, pipeline_id: int, earliest: dict[TopicPartition, int], on_data_loss: OnDataLoss
) -> tuple[int, list[OffsetRange]] | None:
    """The open batch and its ranges, to run again; None if there is none, or if retention deleted part of a
    planned one under `skip` (it is abandoned, and the fresh plan records the gap). Under `fail`, that raises."""
    open_batch = repo.find_open_batch(session, pipeline_id)
    if open_batch is None:
        return None
    ranges = repo.batch_ranges(session, open_batch.id)
    lost = lost_ranges(ranges, earliest) if open_batch.state == BatchState.PLANNED.value else []
    if not lost:
        return open_batch.id, ranges
    error = data_loss_at_read(open_batch.id, lost, on_data_loss)
    if on_data_loss is OnDataLoss.FAIL:
        raise error
    # Retention ran between plan and stage: close the batch; the fresh plan below records the gap.
    repo.abandon_batch(session, open_batch.id, error.message)
    log.warning("abandoned batch %s: %s", open_batch.id, error.message)
    return None
