"""Reads of a pipeline's ranges and gaps: the committed ones, those of open batches, and whether a committed
range ends past an offset."""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from microbatch.ledger.models import OPEN_STATES, Batch, BatchState, LedgerGap, Range
from microbatch.types import CommittedRange, Gap, OffsetRange, TopicPartition


def committed_ranges(session: Session, pipeline_id: int) -> list[OffsetRange]:
    rows = session.execute(
        select(Range.topic, Range.partition, Range.start_offset, Range.end_offset)
        .where(Range.pipeline_id == pipeline_id, Range.committed.is_(True))
        .order_by(Range.topic, Range.partition, Range.start_offset)
    )
    return [OffsetRange(*row) for row in rows]


def committed_range_rows(session: Session, pipeline_id: int) -> list[CommittedRange]:
    """Committed ranges with their row ids and batches (what a replay may replace)."""
    rows = session.execute(
        select(Range.id, Range.batch_id, Range.topic, Range.partition, Range.start_offset, Range.end_offset)
        .where(Range.pipeline_id == pipeline_id, Range.committed.is_(True))
        .order_by(Range.topic, Range.partition, Range.start_offset)
    )
    return [CommittedRange(row[0], row[1], OffsetRange(*row[2:])) for row in rows]


def open_ranges(session: Session, pipeline_id: int) -> list[tuple[int, str, OffsetRange]]:
    """(batch id, state, range) of every batch that is planned or staged."""
    rows = session.execute(
        select(Batch.id, Batch.state, Range.topic, Range.partition, Range.start_offset, Range.end_offset)
        .join(Range, Range.batch_id == Batch.id)
        .where(Batch.pipeline_id == pipeline_id, Batch.state.in_(OPEN_STATES))
    )
    return [(row[0], row[1], OffsetRange(*row[2:])) for row in rows]


def committed_beyond(session: Session, pipeline_id: int, tp: TopicPartition, offset: int) -> bool:
    """Whether a committed range of the partition ends after `offset` (moving back to it would re-read them)."""
    return session.execute(
        text("SELECT max(end_offset) FROM ranges WHERE pipeline_id = :p AND topic = :t AND partition = :n "
             "AND committed AND end_offset > :o"),
        {"p": pipeline_id, "t": tp.topic, "n": tp.partition, "o": offset},
    ).scalar_one_or_none() is not None


def committed_gaps(session: Session, pipeline_id: int) -> list[Gap]:
    # Gaps of committed batches, and gaps an operator recorded with `microbatch reset` (no batch).
    rows = session.execute(
        select(LedgerGap)
        .outerjoin(Batch, Batch.id == LedgerGap.batch_id)
        .where(LedgerGap.pipeline_id == pipeline_id,
               (Batch.state == BatchState.COMMITTED.value) | LedgerGap.batch_id.is_(None))
    ).scalars()
    return [Gap(g.topic, g.partition, g.start_offset, g.end_offset, g.reason) for g in rows]
