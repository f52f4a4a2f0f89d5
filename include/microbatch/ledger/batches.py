"""A batch's rows: inserted as planned with its ranges and gaps, found, failed, abandoned; the open batches and
the state of each."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from microbatch.errors import MicrobatchError
from microbatch.ledger.models import (
    OPEN_STATES,
    Batch,
    BatchKind,
    BatchState,
    LakeCommit,
    LedgerGap,
    Pipeline,
    Range,
)
from microbatch.types import Gap, OffsetRange, Plan


def find_open_batches(session: Session, pipeline_id: int, kind: BatchKind = BatchKind.SCHEDULED) -> list[Batch]:
    """The batches of this kind that are planned or staged but not yet committed, oldest first: one, or the rest
    of a run that planned several (`source.max_batches_per_run`)."""
    return list(session.scalars(
        select(Batch)
        .where(Batch.pipeline_id == pipeline_id, Batch.kind == kind.value, Batch.state.in_(OPEN_STATES))
        .order_by(Batch.id)
    ))


def open_predecessor(session: Session, batch: Batch) -> Batch | None:
    """The open batch of the same pipeline and kind planned just before `batch` in the same run, if any."""
    return session.scalars(
        select(Batch)
        .where(Batch.pipeline_id == batch.pipeline_id, Batch.kind == batch.kind, Batch.id < batch.id,
               Batch.state.in_(OPEN_STATES))
        .order_by(Batch.id.desc())
        .limit(1)
    ).one_or_none()


def open_batch_ids(session: Session, pipeline_id: int) -> list[int]:
    """Ids of the pipeline's planned or staged batches, of any kind, oldest first."""
    return list(session.scalars(
        select(Batch.id).where(Batch.pipeline_id == pipeline_id, Batch.state.in_(OPEN_STATES)).order_by(Batch.id)
    ))


def insert_batch(
    session: Session,
    pipeline: Pipeline,
    plan: Plan,
    *,
    kind: BatchKind = BatchKind.SCHEDULED,
    airflow_run_id: str | None = None,
    run_head: int | None = None,
    formats: dict[str, Any] | None = None,
) -> Batch:
    """Insert a planned batch with its ranges, its gaps and the pipeline state at its start (`run_head`: the first
    batch of the run, for a run's later batches; `formats`: the pins of the registry formats)."""
    batch = Batch(
        pipeline_id=pipeline.id,
        kind=kind.value,
        run_head=run_head,
        state=BatchState.PLANNED.value,
        attempt=0,
        state_before=dict(pipeline.state or {}),
        counts={"planned_records": plan.records},
        timings={},
        airflow_run_id=airflow_run_id,
        formats=formats or None,
    )
    session.add(batch)
    session.flush()
    session.add_all(
        Range(
            batch_id=batch.id,
            pipeline_id=pipeline.id,
            topic=r.topic,
            partition=r.partition,
            start_offset=r.start,
            end_offset=r.end,
        )
        for r in plan.ranges
    )
    session.add_all(
        LedgerGap(
            pipeline_id=pipeline.id,
            batch_id=batch.id,
            topic=g.topic,
            partition=g.partition,
            start_offset=g.start,
            end_offset=g.end,
            reason=g.reason,
        )
        for g in plan.gaps
    )
    session.flush()
    return batch


def get_batch(session: Session, batch_id: int, *, lock: bool = False) -> Batch:
    query = select(Batch).where(Batch.id == batch_id)
    if lock:
        query = query.with_for_update()
    batch = session.scalars(query).one_or_none()
    if batch is None:
        raise MicrobatchError(f"Batch {batch_id} does not exist in the ledger.", fix="Check the batch id.")
    return batch


def batch_ranges(session: Session, batch_id: int) -> list[OffsetRange]:
    rows = session.execute(
        select(Range.topic, Range.partition, Range.start_offset, Range.end_offset)
        .where(Range.batch_id == batch_id)
        .order_by(Range.topic, Range.partition, Range.start_offset)
    )
    return [OffsetRange(*row) for row in rows]


def batch_gaps(session: Session, batch_id: int) -> list[Gap]:
    rows = session.scalars(select(LedgerGap).where(LedgerGap.batch_id == batch_id))
    return [Gap(g.topic, g.partition, g.start_offset, g.end_offset, g.reason) for g in rows]


def record_failure(session: Session, batch_id: int, message: str) -> None:
    """Keep the latest error on the batch row for `microbatch history`; the batch stays open."""
    session.execute(update(Batch).where(Batch.id == batch_id).values(error=message[:2000]))


def abandon_batch(session: Session, batch_id: int, reason: str) -> bool:
    """Close a batch that was planned but never staged, so its ranges are never committed; False if it was not."""
    return session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.state == BatchState.PLANNED.value)
        .values(state=BatchState.ABANDONED.value, error=reason[:2000])
    ).rowcount == 1


def abandon_open_batch(session: Session, pipeline_id: int, batch_id: int, reason: str) -> str | None:
    """Close a planned or staged batch of the pipeline so its ranges are never committed; returns the
    state it had, or None if it was not open. Safe against a live run: its commit locks the batch row
    and refuses a batch that is no longer staged."""
    batch = session.scalars(select(Batch).where(Batch.id == batch_id, Batch.pipeline_id == pipeline_id)
                            .with_for_update()).one_or_none()
    if batch is None or batch.state not in OPEN_STATES:
        return None
    held = session.scalars(select(LakeCommit).where(LakeCommit.batch_id == batch_id)
                           .order_by(LakeCommit.sink)).first()
    if held is not None:  # its rows are in a lakehouse table already: only its commit keeps table and ledger one
        raise MicrobatchError(
            f"Batch {batch_id} is already in version {held.table_version} of {held.location} (sink {held.sink}); "
            "abandoning it would leave its rows in the table without a committed batch.",
            fix="Run the pipeline again instead: the retry finds that version, writes nothing more and commits.")
    was = batch.state
    batch.state = BatchState.ABANDONED.value
    batch.error = reason[:2000]
    return was


def abandon_followers(session: Session, pipeline_id: int, batch_id: int, reason: str) -> list[int]:
    """After a scheduled batch is abandoned, close the open batches its run planned after it (each starts where the
    one before ends, so none of them could commit); their ids."""
    abandoned = session.get(Batch, batch_id)
    if abandoned is None or abandoned.kind != BatchKind.SCHEDULED.value:
        return []
    later = [b.id for b in find_open_batches(session, pipeline_id) if b.id > batch_id]
    return [b for b in later if abandon_open_batch(session, pipeline_id, b, f"{reason}; it followed batch {batch_id}")]


def batch_states(session: Session, pipeline_id: int) -> dict[int, BatchState]:
    """The state of every batch of the pipeline, by id."""
    rows = session.execute(select(Batch.id, Batch.state).where(Batch.pipeline_id == pipeline_id))
    return {batch_id: BatchState(state) for batch_id, state in rows}
