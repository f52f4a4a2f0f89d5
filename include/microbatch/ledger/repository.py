"""Ledger reads and writes. Every function takes the caller's session and never commits:
the caller owns the one transaction (plan, stage bookkeeping, or the commit).

Every write to `positions` is here, and nowhere else: the plan pins the start of new partitions
(`pin_new_positions`), the commit advances by compare-and-set (`advance_position`), and an operator's
reset moves one on the record (`reset_position`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.errors import ConcurrentCommitError, MicrobatchError, ZombieAttemptError
from microbatch.ledger.models import (
    OPEN_STATES,
    Batch,
    BatchKind,
    BatchState,
    LagSnapshot,
    LakeCommit,
    LedgerGap,
    Pipeline,
    Position,
    Range,
)
from microbatch.types import CommittedRange, Gap, OffsetRange, Plan, TopicPartition


def ensure_pipeline(session: Session, spec: PipelineSpec, *, lock: bool = False) -> Pipeline:
    """The pipeline's row, created on first use; `lock` takes it FOR UPDATE to serialize planning."""
    session.execute(
        insert(Pipeline)
        .values(name=spec.name, spec_hash=spec.spec_hash(), state={})
        .on_conflict_do_update(index_elements=[Pipeline.name], set_={"spec_hash": spec.spec_hash()})
    )
    query = select(Pipeline).where(Pipeline.name == spec.name)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).one()


def get_pipeline(session: Session, name: str, *, lock: bool = False) -> Pipeline | None:
    query = select(Pipeline).where(Pipeline.name == name)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


def read_positions(session: Session, pipeline_id: int) -> dict[TopicPartition, int]:
    """The next offset of every partition the ledger has seen."""
    rows = session.execute(
        select(Position.topic, Position.partition, Position.next_offset).where(Position.pipeline_id == pipeline_id)
    )
    return {TopicPartition(topic, partition): offset for topic, partition, offset in rows}


def pin_new_positions(session: Session, pipeline_id: int, starts: dict[TopicPartition, int]) -> int:
    """Record the resolved start of partitions the ledger has never seen, so the startup mode is applied once.

    Only inserts (ON CONFLICT DO NOTHING): a known position is never moved here, only by the commit's
    compare-and-set, which then finds `next_offset = start` as it expects. Returns the rows inserted.
    """
    if not starts:
        return 0
    return session.execute(
        insert(Position)
        .values([
            {"pipeline_id": pipeline_id, "topic": tp.topic, "partition": tp.partition, "next_offset": offset}
            for tp, offset in sorted(starts.items())
        ])
        .on_conflict_do_nothing()
    ).rowcount


def advance_position(
    session: Session, pipeline_id: int, batch_id: int, tp: TopicPartition, start: int, end: int
) -> int | None:
    """The commit's compare-and-set: move one position from `start` to `end` (`... AND next_offset = :start`,
    exactly one row), or give a partition the ledger has never seen its first row. Returns the offset it
    moved from (None for a first row); ConcurrentCommitError if the position is not at `start`."""
    params = {"p": pipeline_id, "t": tp.topic, "n": tp.partition, "start": start, "end": end, "b": batch_id}
    moved = session.execute(
        text(
            "UPDATE positions SET next_offset = :end, last_batch_id = :b, updated_at = now() "
            "WHERE pipeline_id = :p AND topic = :t AND partition = :n AND next_offset = :start"
        ),
        params,
    ).rowcount
    if moved == 1:
        return start
    inserted = session.execute(
        text(
            "INSERT INTO positions (pipeline_id, topic, partition, next_offset, last_batch_id) "
            "VALUES (:p, :t, :n, :end, :b) ON CONFLICT DO NOTHING"
        ),
        params,
    ).rowcount
    if inserted == 1:
        return None
    current = session.execute(
        text("SELECT next_offset FROM positions WHERE pipeline_id = :p AND topic = :t AND partition = :n"), params
    ).scalar_one()
    raise ConcurrentCommitError(
        f"{tp}: the ledger position is {current}, not {start} as batch {batch_id} expected; "
        "another batch committed these offsets first.",
        fix="Nothing was written. Abandon this batch with `microbatch history` to inspect it.",
    )


def reset_position(
    session: Session, pipeline_id: int, tp: TopicPartition, old: int | None, new: int, *, target: str, operator: str
) -> None:
    """An operator's move of one position, by compare-and-set from `old` (None: the ledger has no row yet),
    exactly one row or ConcurrentCommitError. Offsets skipped forward become a gap; an audit row records it."""
    params = {"p": pipeline_id, "t": tp.topic, "n": tp.partition, "old": old, "new": new}
    if old is None:
        changed = session.execute(
            text("INSERT INTO positions (pipeline_id, topic, partition, next_offset) VALUES (:p, :t, :n, :new) "
                 "ON CONFLICT DO NOTHING"), params).rowcount
    else:
        changed = session.execute(
            text("UPDATE positions SET next_offset = :new, updated_at = now() WHERE pipeline_id = :p "
                 "AND topic = :t AND partition = :n AND next_offset = :old"), params).rowcount
    if changed != 1:
        raise ConcurrentCommitError(f"reset: the position of {tp} changed since it was read.",
                                    fix="Nothing was written. Run the reset again.")
    if old is not None and new > old:
        session.execute(
            text("INSERT INTO gaps (pipeline_id, topic, partition, start_offset, end_offset, reason) "
                 "VALUES (:p, :t, :n, :old, :new, :reason)"),
            {**params, "reason": f"skipped by microbatch reset --to {target} ({operator})"},
        )
    session.execute(
        text("INSERT INTO position_resets (pipeline_id, topic, partition, old_offset, new_offset, target, "
             "operator) VALUES (:p, :t, :n, :old, :new, :target, :operator)"),
        {**params, "target": target, "operator": operator},
    )


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


def insert_batch(
    session: Session,
    pipeline: Pipeline,
    plan: Plan,
    *,
    kind: BatchKind = BatchKind.SCHEDULED,
    airflow_run_id: str | None = None,
    run_head: int | None = None,
) -> Batch:
    """Insert a planned batch with its ranges, its gaps and the pipeline state at its start (`run_head`: the first
    batch of the run, for a run's later batches)."""
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


def begin_attempt(session: Session, batch_id: int) -> int | None:
    """Take the next attempt number of an open batch; None if the batch is no longer open.

    Any older attempt still running becomes a zombie: its attempt number no longer matches.
    """
    return session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.state.in_(OPEN_STATES))
        .values(attempt=Batch.attempt + 1, state=BatchState.PLANNED.value, staged_attempt=None, error=None)
        .returning(Batch.attempt)
    ).scalar_one_or_none()


def record_staged(
    session: Session,
    batch_id: int,
    attempt: int,
    counts: dict[str, Any],
    state_after: dict[str, Any],
    timings: dict[str, float],
) -> None:
    """Mark the attempt staged; refuse (ZombieAttemptError) if it is no longer the current one."""
    batch = get_batch(session, batch_id, lock=True)
    if batch.attempt != attempt or batch.state not in OPEN_STATES:
        raise ZombieAttemptError(
            f"Batch {batch_id} attempt {attempt} is superseded (current attempt {batch.attempt}, "
            f"state {batch.state}); its staged rows will never be committed.",
            fix="Nothing to do: the current attempt owns the batch.",
        )
    batch.state = BatchState.STAGED.value
    batch.staged_attempt = attempt
    batch.counts = {**batch.counts, **counts}
    batch.state_after = state_after
    batch.timings = {**batch.timings, **timings}
    batch.staged_at = session.execute(text("SELECT now()")).scalar_one()


def last_read_had_holes(session: Session, pipeline_id: int, batch_id: int) -> bool:
    """Whether the pipeline's latest staged read before `batch_id` returned fewer records than its ranges hold
    offsets: transaction markers, aborted or compacted records."""
    counts = session.scalars(
        select(Batch.counts)
        .where(Batch.pipeline_id == pipeline_id, Batch.id < batch_id, Batch.counts.has_key("records"))
        .order_by(Batch.id.desc())
        .limit(1)
    ).first()
    return counts is not None and int(counts["records"]) < int(counts.get("planned_records") or 0)


def record_failure(session: Session, batch_id: int, message: str) -> None:
    """Keep the latest error on the batch row for `microbatch history`; the batch stays open."""
    session.execute(update(Batch).where(Batch.id == batch_id).values(error=message[:2000]))


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


def open_batch_ids(session: Session, pipeline_id: int) -> list[int]:
    """Ids of the pipeline's planned or staged batches, of any kind, oldest first."""
    return list(session.execute(
        text("SELECT id FROM batches WHERE pipeline_id = :p AND state IN ('planned', 'staged') ORDER BY id"),
        {"p": pipeline_id},
    ).scalars())


def committed_beyond(session: Session, pipeline_id: int, tp: TopicPartition, offset: int) -> bool:
    """Whether a committed range of the partition ends after `offset` (moving back to it would re-read them)."""
    return session.execute(
        text("SELECT max(end_offset) FROM ranges WHERE pipeline_id = :p AND topic = :t AND partition = :n "
             "AND committed AND end_offset > :o"),
        {"p": pipeline_id, "t": tp.topic, "n": tp.partition, "o": offset},
    ).scalar_one_or_none() is not None


def batches_without_contributions(session: Session, batch_ids: list[int]) -> list[int]:
    """Committed batches whose per-partition contributions were not kept (committed before 0005)."""
    if not batch_ids:
        return []
    rows = session.scalars(select(Batch.id).where(Batch.id.in_(batch_ids)).where(
        Batch.counts["contributions"].astext.is_distinct_from("true")).order_by(Batch.id))
    return list(rows)


def committed_gaps(session: Session, pipeline_id: int) -> list[Gap]:
    # Gaps of committed batches, and gaps an operator recorded with `microbatch reset` (no batch).
    rows = session.execute(
        select(LedgerGap)
        .outerjoin(Batch, Batch.id == LedgerGap.batch_id)
        .where(LedgerGap.pipeline_id == pipeline_id,
               (Batch.state == BatchState.COMMITTED.value) | LedgerGap.batch_id.is_(None))
    ).scalars()
    return [Gap(g.topic, g.partition, g.start_offset, g.end_offset, g.reason) for g in rows]


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


def pipeline_uid(session: Session, pipeline_id: int) -> str:
    """The ledger's identity of a pipeline, which its lakehouse commits carry."""
    return session.execute(select(Pipeline.uid).where(Pipeline.id == pipeline_id)).scalar_one()
