"""What a plan reads from the ledger and writes to it: a scheduled run's (`read_planning_ledger`, `record_run`) and
a backfill's (`read_backfill_ledger`, `insert_backfill_batches`), each under the pipeline row's lock."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.ledger.batches import (
    abandon_batch,
    abandon_followers,
    batch_ranges,
    find_open_batches,
    get_batch,
    insert_batch,
)
from microbatch.ledger.lag import LAG_PRUNE_EVERY, prune_lag_snapshots, record_lag
from microbatch.ledger.models import Batch, BatchKind, BatchState, Pipeline
from microbatch.ledger.pipelines import ensure_pipeline
from microbatch.ledger.positions import pin_new_positions, read_positions
from microbatch.ledger.ranges import committed_range_rows, committed_ranges, open_ranges
from microbatch.types import BackfillBatch, BackfillLedger, OpenBatch, Plan, PlanningLedger, TopicPartition


def read_planning_ledger(session: Session, spec: PipelineSpec) -> tuple[Pipeline, PlanningLedger]:
    """Lock the pipeline row (FOR UPDATE, so two planners never race) and read what a plan decides from: the open
    scheduled batches with their ranges, oldest first, the positions, and the time since the last batch."""
    pipeline = ensure_pipeline(session, spec, lock=True)
    open_batches = [OpenBatch(batch.id, batch.state == BatchState.PLANNED.value, batch_ranges(session, batch.id))
                    for batch in find_open_batches(session, pipeline.id)]
    return pipeline, PlanningLedger(open_batches, read_positions(session, pipeline.id),
                                    seconds_since_last_batch(session, pipeline.id))


def seconds_since_last_batch(session: Session, pipeline_id: int) -> float:
    """Seconds since the pipeline's last batch was planned (or since the pipeline row was created)."""
    return float(session.execute(
        text(
            "SELECT extract(epoch FROM now() - coalesce("
            "(SELECT max(created_at) FROM batches WHERE pipeline_id = :p), "
            "(SELECT created_at FROM pipelines WHERE id = :p)))"
        ),
        {"p": pipeline_id},
    ).scalar_one() or 0.0)


def record_run(
    session: Session, pipeline: Pipeline, plan: Plan | None, plans: list[Plan], *,
    abandon_from: tuple[int, str] | None, latest: dict[TopicPartition, int], airflow_run_id: str | None,
    started: float, formats: dict[str, Any] | None = None,
) -> tuple[list[int], list[int], int]:
    """Write what one plan decided: abandon the open batches from `abandon_from` on (with its reason); then, for a
    fresh `plan`, pin the start of its new partitions, insert `plans` as the run's batches (timed from the
    monotonic `started`), record the lag and now and then prune old lag snapshots. Returns (abandoned batch ids,
    inserted batch ids, lag snapshots pruned)."""
    abandoned: list[int] = []
    if abandon_from is not None:
        batch_id, reason = abandon_from
        abandoned = [batch_id] if abandon_batch(session, batch_id, reason) else []
        abandoned += abandon_followers(session, pipeline.id, batch_id, reason)
    if plan is None:
        return abandoned, [], 0
    pin_new_positions(session, pipeline.id, {tp: plan.starts[tp] for tp in plan.new_partitions})
    batch_ids: list[int] = []
    for each in plans:
        batch = insert_batch(session, pipeline, each, airflow_run_id=airflow_run_id,
                             run_head=batch_ids[0] if batch_ids else None, formats=formats)
        batch.timings = {"plan_s": round(time.monotonic() - started, 3)}
        batch_ids.append(batch.id)
    record_lag(session, pipeline.id, batch_ids[0] if batch_ids else None, plan, latest)
    pruned = 0
    if any(batch_id % LAG_PRUNE_EVERY == 0 for batch_id in batch_ids):
        pruned = prune_lag_snapshots(session, pipeline.id)
    return abandoned, batch_ids, pruned


def read_backfill_ledger(session: Session, spec: PipelineSpec, *, replay: bool) -> tuple[Pipeline, BackfillLedger]:
    """Lock the pipeline row (FOR UPDATE) and read what a backfill plans from: for a fill the positions and the
    committed ranges, for a replay the committed range rows and their batches without contributions; for both the
    ranges of the batches still open."""
    pipeline = ensure_pipeline(session, spec, lock=True)
    if replay:
        rows = committed_range_rows(session, pipeline.id)
        ledger = BackfillLedger(
            positions={}, committed=[], committed_rows=rows, open_ranges=open_ranges(session, pipeline.id),
            without_contributions=batches_without_contributions(session, sorted({c.batch_id for c in rows})))
    else:
        ledger = BackfillLedger(
            positions=read_positions(session, pipeline.id), committed=committed_ranges(session, pipeline.id),
            committed_rows=[], open_ranges=open_ranges(session, pipeline.id), without_contributions=[])
    return pipeline, ledger


def batches_without_contributions(session: Session, batch_ids: list[int]) -> list[int]:
    """Committed batches whose per-partition contributions were not kept (committed before 0005)."""
    if not batch_ids:
        return []
    rows = session.scalars(select(Batch.id).where(Batch.id.in_(batch_ids)).where(
        Batch.counts["contributions"].astext.is_distinct_from("true")).order_by(Batch.id))
    return list(rows)


def insert_backfill_batches(session: Session, pipeline: Pipeline, batches: list[BackfillBatch], *, kind: BatchKind,
                            airflow_run_id: str | None, formats: dict[str, Any] | None = None) -> list[int]:
    """Insert a backfill's batches; a fill batch starts from no state (history: no watermark, so nothing in it is
    late) and decodes with the registry formats' `formats` pins, a replay batch from the state of the batch it
    replays, whose range rows it replaces, and with its schemas (its pins, writers included)."""
    batch_ids: list[int] = []
    for each in batches:
        original = get_batch(session, each.original) if each.original is not None else None
        pins = dict(original.formats or {}) if original is not None else formats
        batch = insert_batch(session, pipeline, Plan(ranges=each.ranges), kind=kind, airflow_run_id=airflow_run_id,
                             formats=pins)
        batch.state_before = dict(original.state_before or {}) if original is not None else {}
        if original is not None:
            batch.replaces = list(each.replaces)
        batch_ids.append(batch.id)
    return batch_ids
