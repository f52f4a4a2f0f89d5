"""Lag snapshots: what each plan saw of every partition's lag, kept a week (each partition's newest always)."""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from microbatch.ledger.models import LagSnapshot
from microbatch.types import Plan, TopicPartition


def record_lag(
    session: Session,
    pipeline_id: int,
    batch_id: int | None,
    plan: Plan,
    latest: dict[TopicPartition, int],
) -> None:
    """One lag snapshot per discovered partition: its start, the latest offset seen, the lag before and after."""
    after = plan.lag_after_by_partition()
    rows = [
        {
            "pipeline_id": pipeline_id, "batch_id": batch_id, "topic": tp.topic, "partition": tp.partition,
            "start_offset": start, "latest_offset": latest[tp], "lag": plan.backlog.get(tp, 0),
            "lag_after": after.get(tp, 0),
        }
        for tp, start in sorted(plan.starts.items())
    ]
    if rows:
        session.execute(insert(LagSnapshot).values(rows))


LAG_RETENTION_DAYS = 7
LAG_PRUNE_EVERY = 50
"""Lag snapshots older than the retention are pruned on every `LAG_PRUNE_EVERY`th batch, except each
partition's newest, so `status` still shows the lag of an idle or vanished partition."""


def prune_lag_snapshots(session: Session, pipeline_id: int, keep_days: int = LAG_RETENTION_DAYS) -> int:
    """Delete the pipeline's lag snapshots older than `keep_days` that are not their partition's newest."""
    return session.execute(text(
        "DELETE FROM lag_snapshots s WHERE s.pipeline_id = :p AND s.planned_at < now() - make_interval(days => :d)"
        " AND EXISTS (SELECT 1 FROM lag_snapshots n WHERE n.pipeline_id = s.pipeline_id AND n.topic = s.topic"
        " AND n.partition = s.partition AND n.id > s.id)"
    ), {"p": pipeline_id, "d": keep_days}).rowcount


def latest_lag(session: Session, pipeline_id: int) -> list[LagSnapshot]:
    """The most recent lag snapshot of every partition of the pipeline, by topic and partition."""
    return list(session.scalars(
        select(LagSnapshot)
        .where(LagSnapshot.pipeline_id == pipeline_id)
        .order_by(LagSnapshot.topic, LagSnapshot.partition, LagSnapshot.id.desc())
        .distinct(LagSnapshot.topic, LagSnapshot.partition)
    ))
