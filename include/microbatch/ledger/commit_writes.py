"""The commit's ledger writes: the batch's ranges committed (a replay's superseding the ones it replaces), its
staged bad records moved into their tables, and the batch marked committed."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from microbatch.errors import ConcurrentCommitError
from microbatch.ledger.fragments import staged_rows, superseded_ranges
from microbatch.ledger.models import (
    STAGE_DEAD_LETTERS,
    STAGE_LATE_RECORDS,
    Batch,
    BatchState,
    DeadLetter,
    LateRecord,
    Pipeline,
    Range,
)


def lock_ranges(session: Session, range_ids: list[int]) -> list[Range]:
    """The ranges with these ids, locked FOR UPDATE, by id (what a replay batch is about to supersede)."""
    return list(session.scalars(select(Range).where(Range.id.in_(range_ids)).order_by(Range.id).with_for_update()))


def supersede_ranges(session: Session, replay_batch_id: int, range_ids: list[int]) -> None:
    """Mark committed ranges superseded by a replay batch (kept for the audit), and delete the dead letters and
    late records they had committed: the replay's own take their place."""
    session.execute(
        update(Range).where(Range.id.in_(range_ids)).values(committed=False, superseded_by=replay_batch_id)
    )
    for table in (DeadLetter.__tablename__, LateRecord.__tablename__):
        session.execute(
            text(f"DELETE FROM {table} d USING {superseded_ranges('g')} AND d.batch_id = g.batch_id "
                 "AND d.topic = g.topic AND d.partition = g.partition"),
            {"batch_id": replay_batch_id},
        )


def partly_superseded_batch(session: Session, replay_batch_id: int) -> int | None:
    """A batch of which the replay batch supersedes some ranges but not all, if any (a per-batch retraction would
    take back more than the replay recomputes)."""
    return session.execute(text(
        f"SELECT o.batch_id FROM {Range.__tablename__} o WHERE o.batch_id IN "
        f"(SELECT batch_id FROM {superseded_ranges()}) "
        "AND o.superseded_by IS DISTINCT FROM :batch_id LIMIT 1"), {"batch_id": replay_batch_id}).scalar()


def commit_ranges(session: Session, batch_id: int) -> None:
    """Mark the batch's ranges committed; the exclusion constraint refuses any overlap with committed ones
    (ConcurrentCommitError, the caller's transaction intact)."""
    try:
        with session.begin_nested():
            session.execute(update(Range).where(Range.batch_id == batch_id).values(committed=True))
    except IntegrityError:
        raise ConcurrentCommitError(
            f"Batch {batch_id} overlaps offsets that another batch already committed; the database refused it.",
            fix="Nothing was written. Inspect the batch with `microbatch history`.",
        ) from None


def move_staged_bad_records(session: Session, pipeline_id: int, batch_id: int, attempt: int,
                            watermark: datetime | None) -> tuple[int, int]:
    """Move the attempt's staged dead letters and late records into their tables (a late record keeps
    `watermark`, the one that made it late); (dead letters, late records) moved."""
    params = {"batch_id": batch_id, "attempt": attempt, "pipeline_id": pipeline_id}
    dead = session.execute(
        text(
            f'INSERT INTO {DeadLetter.__tablename__} (pipeline_id, batch_id, topic, partition, "offset", raw, error, '
            '"key", "timestamp", headers) SELECT :pipeline_id, batch_id, topic, partition, "offset", raw, error, '
            f'"key", "timestamp", CAST(headers AS jsonb) FROM {staged_rows(STAGE_DEAD_LETTERS.name)}'
        ),
        params,
    ).rowcount
    late = session.execute(
        text(
            f'INSERT INTO {LateRecord.__tablename__} (pipeline_id, batch_id, topic, partition, "offset", event_time, '
            'raw, watermark, headers) SELECT :pipeline_id, batch_id, topic, partition, "offset", event_time, raw, '
            f":watermark, CAST(headers AS jsonb) FROM {staged_rows(STAGE_LATE_RECORDS.name)}"
        ),
        {**params, "watermark": watermark},
    ).rowcount
    return dead, late


def clear_staged_bad_records(session: Session, batch_id: int) -> None:
    """Delete the batch's staged dead letters and late records, of every attempt."""
    for table in (STAGE_DEAD_LETTERS, STAGE_LATE_RECORDS):
        session.execute(table.delete().where(table.c.batch_id == batch_id))


def mark_committed(session: Session, batch: Batch, pipeline: Pipeline, run_id: str | None, *,
                   advance_state: bool) -> None:
    """Mark the batch committed by the Airflow run `run_id` (its contributions kept), and with `advance_state`
    make its state after the pipeline's state (a backfill leaves the pipeline's state alone)."""
    if advance_state:
        pipeline.state = dict(batch.state_after or {})
    batch.state = BatchState.COMMITTED.value
    batch.counts = {**batch.counts, "contributions": True}
    batch.committed_at = session.execute(text("SELECT now()")).scalar_one()
    batch.committed_run_id = run_id
