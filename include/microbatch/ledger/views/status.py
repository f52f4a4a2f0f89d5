"""The pipelines the ledger holds, and per partition its position, lag and last commit (`microbatch status`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.types import TopicPartition


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    position: int | None
    latest: int | None
    lag: int | None
    last_batch_id: int | None
    last_commit_age_s: float | None


def pipeline_names(session: Session) -> list[str]:
    return list(session.execute(text("SELECT name FROM pipelines ORDER BY name")).scalars())


def pipeline_id(session: Session, name: str) -> int | None:
    return session.execute(text("SELECT id FROM pipelines WHERE name = :n"), {"n": name}).scalar_one_or_none()


def partition_status(
    session: Session, pipeline: int, latest: dict[TopicPartition, int] | None = None
) -> list[PartitionStatus]:
    """Per partition: the ledger position, the latest offset (when given), the lag and the last commit."""
    rows = session.execute(
        text(
            "SELECT p.topic, p.partition, p.next_offset, p.last_batch_id, b.committed_at "
            "FROM positions p LEFT JOIN batches b ON b.id = p.last_batch_id "
            "WHERE p.pipeline_id = :p ORDER BY p.topic, p.partition"
        ),
        {"p": pipeline},
    ).all()
    now = datetime.now(tz=UTC)
    known = {TopicPartition(r.topic, r.partition): r for r in rows}
    result = []
    for tp in sorted(set(known) | set(latest or {})):
        row = known.get(tp)
        position = row.next_offset if row else None
        end = (latest or {}).get(tp)
        result.append(
            PartitionStatus(
                topic=tp.topic,
                partition=tp.partition,
                position=position,
                latest=end,
                lag=None if end is None or position is None else max(0, end - position),
                last_batch_id=row.last_batch_id if row else None,
                last_commit_age_s=(now - row.committed_at).total_seconds() if row and row.committed_at else None,
            )
        )
    return result
