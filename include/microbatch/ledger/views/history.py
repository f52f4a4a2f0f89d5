"""A pipeline's batches, backfills and recorded gaps, newest first, and who accounts for one offset
(`microbatch history`, `gaps`, `find`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.ledger.models import BatchState


@dataclass
class BatchRange:
    """Offsets [start, end) of one partition that a batch read; `superseded_by` is the replay that replaced them."""

    topic: str
    partition: int
    start: int
    end: int
    superseded_by: int | None = None

    def __str__(self) -> str:
        replaced = f" replaced by {self.superseded_by}" if self.superseded_by is not None else ""
        return f"{self.topic}[{self.partition}] [{self.start}, {self.end}){replaced}"


@dataclass
class BatchSummary:
    id: int
    kind: str
    state: str
    attempt: int
    ranges: list[BatchRange]
    records: int | None
    dead_letters: int | None
    late_records: int | None
    durations: dict[str, Any]
    airflow_run_id: str | None
    created_at: datetime
    committed_at: datetime | None
    error: str | None
    committed_run_id: str | None = None

    @property
    def ranges_text(self) -> str:
        """The ranges on one line, for a table: `topic[p] [start, end)`, and who replaced them."""
        return " ".join(str(r) for r in self.ranges)


@dataclass
class GapSummary:
    """Offsets [start, end) of one partition recorded as lost, and the batch that recorded them."""

    id: int
    batch_id: int | None
    batch_state: str | None
    topic: str
    partition: int
    start: int
    end: int
    size: int
    reason: str
    created_at: datetime


@dataclass
class OffsetOwner:
    """Who accounts for one offset: a committed batch, a recorded gap, or nobody yet; `dead_letter`: the reason,
    when the batch kept the record as a dead letter."""

    kind: str  # "batch", "gap" or "none"
    batch_id: int | None = None
    airflow_run_id: str | None = None
    start: int | None = None
    end: int | None = None
    reason: str | None = None
    dead_letter: str | None = None


def to_dict(item: object) -> dict[str, Any]:
    """A JSON-friendly dict of one of the dataclasses of the views (`ledger/views/`)."""
    data = asdict(item)  # type: ignore[call-overload]
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in data.items()}


def batch_history(session: Session, pipeline: int, limit: int = 20) -> list[BatchSummary]:
    """The most recent batches, newest first, with their ranges, counts and durations."""
    return _batches(session, pipeline, limit, kind=None)


def backfill_batches(session: Session, pipeline: int, limit: int = 20) -> list[BatchSummary]:
    """The most recent backfills (batches of kind `backfill` or `replay`), newest first: what each one re-read."""
    return _batches(session, pipeline, limit, kind="backfill,replay")


def _batches(session: Session, pipeline: int, limit: int, kind: str | None) -> list[BatchSummary]:
    rows = session.execute(
        text(
            "SELECT b.*, (SELECT json_agg(json_build_array(r.topic, r.partition, r.start_offset, r.end_offset, "
            "r.superseded_by) ORDER BY r.topic, r.partition, r.start_offset) FROM ranges r WHERE r.batch_id = b.id) "
            "AS range_rows FROM batches b WHERE b.pipeline_id = :p "
            "AND (CAST(:k AS text) IS NULL OR b.kind = ANY(string_to_array(:k, ','))) "
            "ORDER BY b.id DESC LIMIT :n"
        ),
        {"p": pipeline, "n": limit, "k": kind},
    ).mappings()
    return [
        BatchSummary(
            id=row["id"],
            kind=row["kind"],
            state=row["state"],
            attempt=row["attempt"],
            ranges=[BatchRange(*r) for r in row["range_rows"] or []],
            records=(row["counts"] or {}).get("records"),
            dead_letters=(row["counts"] or {}).get("dead_letters"),
            late_records=(row["counts"] or {}).get("late_records"),
            durations=dict(row["timings"] or {}),
            airflow_run_id=row["airflow_run_id"],
            committed_run_id=row["committed_run_id"],
            created_at=row["created_at"],
            committed_at=row["committed_at"],
            error=row["error"],
        )
        for row in rows
    ]


def recorded_gaps(session: Session, pipeline: int, limit: int = 50) -> list[GapSummary]:
    """Offsets the ledger records as lost, newest first, with the batch that recorded each and its state.

    Only gaps of committed batches count as lost; those of open or failed batches are shown for context.
    """
    rows = session.execute(
        text(
            "SELECT g.id, g.batch_id, b.state AS batch_state, g.topic, g.partition, g.start_offset, g.end_offset, "
            "g.reason, g.created_at FROM gaps g LEFT JOIN batches b ON b.id = g.batch_id "
            "WHERE g.pipeline_id = :p ORDER BY g.id DESC LIMIT :n"
        ),
        {"p": pipeline, "n": limit},
    ).all()
    return [
        GapSummary(
            id=r.id,
            batch_id=r.batch_id,
            batch_state=r.batch_state,
            topic=r.topic,
            partition=r.partition,
            start=r.start_offset,
            end=r.end_offset,
            size=r.end_offset - r.start_offset,
            reason=r.reason,
            created_at=r.created_at,
        )
        for r in rows
    ]


def find_offset(session: Session, pipeline: int, topic: str, partition: int, offset: int) -> OffsetOwner:
    """The committed batch (and its Airflow run) that processed an offset, or the gap that lost it."""
    params = {"p": pipeline, "t": topic, "n": partition, "o": offset, "committed": BatchState.COMMITTED.value}
    row = session.execute(
        text(
            "SELECT b.id, b.airflow_run_id, r.start_offset, r.end_offset FROM ranges r "
            "JOIN batches b ON b.id = r.batch_id WHERE r.pipeline_id = :p AND r.topic = :t AND r.partition = :n "
            "AND r.committed AND int8range(r.start_offset, r.end_offset) @> CAST(:o AS bigint)"
        ),
        params,
    ).one_or_none()
    if row:
        dead = session.execute(text(
            "SELECT error FROM dead_letters WHERE pipeline_id = :p AND topic = :t AND partition = :n "
            'AND "offset" = :o'), params).scalar()
        return OffsetOwner("batch", row.id, row.airflow_run_id, row.start_offset, row.end_offset, dead_letter=dead)
    gap = session.execute(
        text(
            "SELECT g.batch_id, g.start_offset, g.end_offset, g.reason FROM gaps g "
            "LEFT JOIN batches b ON b.id = g.batch_id WHERE g.pipeline_id = :p AND g.topic = :t "
            "AND g.partition = :n AND (b.state = :committed OR g.batch_id IS NULL) "
            "AND int8range(g.start_offset, g.end_offset) @> CAST(:o AS bigint)"
        ),
        params,
    ).one_or_none()
    if gap:
        return OffsetOwner("gap", gap.batch_id, None, gap.start_offset, gap.end_offset, gap.reason)
    return OffsetOwner("none")
