"""Ledger reads and writes. Every function takes the caller's session and never commits:
the caller owns the one transaction (plan, stage bookkeeping, or the commit).

Every write to `positions` is here, and nowhere else: the plan pins the start of new partitions
(`pin_new_positions`), the commit advances by compare-and-set (`advance_position`), and an operator's
reset moves one on the record (`reset_position`)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.errors import ConcurrentCommitError, MicrobatchError, ZombieAttemptError
from microbatch.ledger.fragments import staged_rows, superseded_ranges
from microbatch.ledger.models import (
    OPEN_STATES,
    STAGE_DEAD_LETTERS,
    STAGE_LATE_RECORDS,
    Batch,
    BatchKind,
    BatchState,
    DeadLetter,
    LagSnapshot,
    LakeCommit,
    LateRecord,
    LedgerGap,
    OutboxRow,
    Pipeline,
    Position,
    PublishProgress,
    Range,
    RegistrySchema,
)
from microbatch.types import (
    BackfillBatch,
    BackfillLedger,
    CommittedRange,
    Gap,
    OffsetRange,
    OpenBatch,
    Plan,
    PlanningLedger,
    StageStart,
    TopicPartition,
)


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


def pipeline_state(session: Session, pipeline_id: int) -> dict[str, Any]:
    """The pipeline state as of its last committed batch ({} for a pipeline the ledger does not hold)."""
    pipeline = session.get(Pipeline, pipeline_id)
    return dict(pipeline.state or {}) if pipeline is not None else {}


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


def begin_stage(session: Session, batch_id: int, *, waited: bool) -> StageStart:
    """Read the batch and take its next attempt number, with all the stage needs of it: the ranges it reads, the
    state it starts from, whether to count per partition, and its pipeline's identity; no attempt
    (`StageStart.attempt` None) if the batch is committed, no longer open, or (after `waited` for the stage lock)
    staged by a concurrent run."""
    batch = get_batch(session, batch_id)
    if batch.state == BatchState.COMMITTED.value or (waited and batch.state == BatchState.STAGED.value):
        return StageStart(batch.state, batch.staged_attempt, None)
    state_before = _stage_state_before(session, batch) if batch.state in OPEN_STATES else {}
    attempt = begin_attempt(session, batch_id)
    if attempt is None:
        return StageStart(batch.state, batch.staged_attempt, None)
    # A pipeline whose last read had holes (a transactional producer's markers) counts per partition in the
    # same pass; any other counts them only if this read turns out to have holes (`records_read`).
    holes = last_read_had_holes(session, batch.pipeline_id, batch_id)
    return StageStart(batch.state, batch.staged_attempt, attempt, batch_ranges(session, batch_id), state_before,
                      holes, batch.pipeline_id, pipeline_uid(session, batch.pipeline_id), dict(batch.formats or {}),
                      int(batch.created_at.timestamp() * 1_000_000))


def _stage_state_before(session: Session, batch: Batch) -> dict[str, Any]:
    """The pipeline state a scheduled batch starts from, fixed when its attempt begins: the state after the open
    batch planned before it in the same run (which this stage staged first), or else the pipeline's committed
    state. A backfill batch keeps the state it was planned with."""
    if batch.kind != BatchKind.SCHEDULED.value:
        return dict(batch.state_before or {})
    before = open_predecessor(session, batch)
    if before is None:
        state = pipeline_state(session, batch.pipeline_id)
    elif before.state == BatchState.STAGED.value and before.staged_attempt == before.attempt:
        state = dict(before.state_after or {})
    else:
        raise MicrobatchError(
            f"Batch {batch.id} starts where batch {before.id} ends, and batch {before.id} is not staged yet.",
            fix=f"Stage batch {before.id} first: the stage task stages a run's batches in order.",
        )
    batch.state_before = state
    return state


def record_staged(
    session: Session,
    batch_id: int,
    attempt: int,
    counts: dict[str, Any],
    state_after: dict[str, Any],
    timings: dict[str, float],
    formats: dict[str, Any] | None = None,
) -> None:
    """Mark the attempt staged (with the pins of its registry formats, `formats`); refuse (ZombieAttemptError) if it
    is no longer the current one."""
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
    if formats:
        batch.formats = formats
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
    return list(session.scalars(
        select(Batch.id).where(Batch.pipeline_id == pipeline_id, Batch.state.in_(OPEN_STATES)).order_by(Batch.id)
    ))


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


def known_positions(session: Session, name: str) -> dict[TopicPartition, int]:
    """The positions of the pipeline named `name`, read only (none if the ledger has never seen it)."""
    pipeline = get_pipeline(session, name)
    return read_positions(session, pipeline.id) if pipeline is not None else {}


def read_planning_ledger(session: Session, spec: PipelineSpec) -> tuple[Pipeline, PlanningLedger]:
    """Lock the pipeline row (FOR UPDATE, so two planners never race) and read what a plan decides from: the open
    scheduled batches with their ranges, oldest first, the positions, and the time since the last batch."""
    pipeline = ensure_pipeline(session, spec, lock=True)
    open_batches = [OpenBatch(batch.id, batch.state == BatchState.PLANNED.value, batch_ranges(session, batch.id))
                    for batch in find_open_batches(session, pipeline.id)]
    return pipeline, PlanningLedger(open_batches, read_positions(session, pipeline.id),
                                    seconds_since_last_batch(session, pipeline.id))


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


def record_schemas(session: Session, pipeline_id: int, schemas: dict[int, str]) -> None:
    """Keep each schema's text by its registry id for the pipeline (once: a registry never changes an id's
    schema)."""
    if schemas:
        session.execute(insert(RegistrySchema).values(
            [{"pipeline_id": pipeline_id, "schema_id": schema_id, "schema": text_}
             for schema_id, text_ in sorted(schemas.items())]).on_conflict_do_nothing())


def kept_schemas(session: Session, pipeline_id: int, schema_ids: list[int]) -> dict[int, str]:
    """The schemas the ledger keeps for the pipeline among `schema_ids`, by id."""
    rows = session.execute(select(RegistrySchema.schema_id, RegistrySchema.schema).where(
        RegistrySchema.pipeline_id == pipeline_id, RegistrySchema.schema_id.in_(schema_ids)))
    return {int(schema_id): schema for schema_id, schema in rows}


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


# --- the commit: ranges, bad records, the batch's end ----------------------------------------------------


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


# --- the outbox and its publisher -------------------------------------------------------------------------

OUTBOX_CORRECTION = " || jsonb_build_object('correction', true)"


def outbox_insert_sql(relation: str, order: str, key: str, *, correction: bool = False, ctes: str = "",
                      coordinates: bool = False) -> str:
    """One outbox row per row of the relation `final` (`relation`, or `ctes` defines it), keyed by its column
    `key` (an SQL name), its value the row as JSON, numbered in `order` after the sink's last sequence; with
    `coordinates`, the row's `topic`, `partition` and `offset` are kept beside it (`outbox_row_changes_sql` reads
    them). Binds :pipeline_id, :sink and :batch_id."""
    kept = ", src_topic, src_partition, src_offset" if coordinates else ""
    values = ', final.topic, final."partition", final."offset"' if coordinates else ""
    return (
        f"{ctes}INSERT INTO {OutboxRow.__tablename__} (pipeline_id, sink, seq, batch_id, key, value{kept}) "
        f"SELECT :pipeline_id, :sink, base.seq + row_number() OVER (ORDER BY {order}), :batch_id, "
        f"final.{key}::text, to_jsonb(final){OUTBOX_CORRECTION if correction else ''}{values} "
        f"FROM {relation}, {_NEXT_SEQ} "
        "RETURNING seq"
    )


_NEXT_SEQ = (f"(SELECT coalesce(max(seq), 0) AS seq FROM {OutboxRow.__tablename__} WHERE pipeline_id = :pipeline_id "
             "AND sink = :sink) AS base")
_COORDINATES = 'topic, "partition", "offset"'
_RETRACTION = ("""o.topic, o."partition", o."offset", o.key, jsonb_build_object('topic', o.topic, """
               """'partition', o."partition", 'offset', o."offset", 'retraction', true)""")


def outbox_row_changes_sql(new_rows: str, key: str) -> str:
    """A replay's outbox rows for a sink that publishes rows (each with its source coordinates): of the rows the
    replay gives (`new_rows`, a SELECT of the published columns and `topic`, `partition`, `offset`), each whose JSON
    differs from the last one published for its coordinates, or that none was published for, as a correction; for
    each row last published in a range the replay supersedes that it no longer gives, a retraction (its
    coordinates and `"retraction": true`, under the key it had); for an identical row, nothing. Numbered by
    coordinates after the sink's last sequence. Binds :pipeline_id, :sink, :batch_id (the replay batch) and what
    `new_rows` binds."""
    join = ("o.src_topic = g.topic AND o.src_partition = g.partition AND o.src_offset >= g.start_offset "
            "AND o.src_offset < g.end_offset")
    table = OutboxRow.__tablename__
    return (
        f"WITH new AS ({new_rows}), "
        "old AS (SELECT DISTINCT ON (o.src_topic, o.src_partition, o.src_offset) o.src_topic AS topic, "
        'o.src_partition AS "partition", o.src_offset AS "offset", o.key, o.value '
        f"FROM {table} o JOIN {superseded_ranges('g', join)} AND o.pipeline_id = :pipeline_id AND o.sink = :sink "
        "ORDER BY o.src_topic, o.src_partition, o.src_offset, o.seq DESC), "
        f'changes AS (SELECT n.topic, n."partition", n."offset", n.{key}::text AS k, to_jsonb(n) AS doc '
        f"FROM new n LEFT JOIN old o USING ({_COORDINATES}) "
        "WHERE o.value IS NULL OR o.value -> 'retraction' IS NOT NULL OR o.value - 'correction' <> to_jsonb(n) "
        f"UNION ALL SELECT {_RETRACTION} "
        f"FROM old o LEFT JOIN new n USING ({_COORDINATES}) "
        "WHERE n.topic IS NULL AND o.value -> 'retraction' IS NULL) "
        f"INSERT INTO {table} (pipeline_id, sink, seq, batch_id, key, value, src_topic, src_partition, src_offset) "
        'SELECT :pipeline_id, :sink, base.seq + row_number() OVER (ORDER BY c.topic, c."partition", c."offset"), '
        f'    :batch_id, c.k, c.doc{OUTBOX_CORRECTION}, c.topic, c."partition", c."offset" FROM changes c, {_NEXT_SEQ} '
        "RETURNING seq"
    )


def append_outbox(session: Session, pipeline_id: int, sink: str, batch_id: int, statement: str,
                  params: dict[str, Any]) -> tuple[int, int] | None:
    """Run an `outbox_insert_sql` statement for the batch; (first, last) sequence written, None if none. The
    commit holds the pipeline row's lock, so the numbering cannot race."""
    seqs = session.execute(
        text(statement), {"pipeline_id": pipeline_id, "sink": sink, "batch_id": batch_id, **params}
    ).scalars().all()
    return (min(seqs), max(seqs)) if seqs else None


def pending_outbox(session: Session, pipeline_id: int, sink: str, after: int,
                   limit: int) -> list[tuple[int, str | None, dict[str, Any]]]:
    """Up to `limit` outbox rows (seq, key, value) of the sink after sequence `after`, in order."""
    rows = session.execute(
        select(OutboxRow.seq, OutboxRow.key, OutboxRow.value)
        .where(OutboxRow.pipeline_id == pipeline_id, OutboxRow.sink == sink, OutboxRow.seq > after)
        .order_by(OutboxRow.seq).limit(limit)
    ).all()
    return [(seq, key, value) for seq, key, value in rows]


def record_publish_progress(session: Session, pipeline_id: int, sink: str, last_seq: int) -> None:
    """Count one more published transaction of the sink, up to `last_seq` (progress never moves back)."""
    session.execute(
        text("INSERT INTO publish_progress (pipeline_id, sink, last_seq, transactions) VALUES (:p, :s, :q, 1) "
             "ON CONFLICT (pipeline_id, sink) DO UPDATE SET last_seq = greatest(publish_progress.last_seq, "
             "EXCLUDED.last_seq), transactions = publish_progress.transactions + 1, updated_at = now()"),
        {"p": pipeline_id, "s": sink, "q": last_seq},
    )


def publish_bounds(session: Session, pipeline_id: int, sink: str) -> tuple[int, int]:
    """(recorded progress, highest outbox sequence) of one sink; 0 for none."""
    progress = session.scalars(select(PublishProgress.last_seq).where(
        PublishProgress.pipeline_id == pipeline_id, PublishProgress.sink == sink)).one_or_none()
    highest = session.scalars(select(func.coalesce(func.max(OutboxRow.seq), 0)).where(
        OutboxRow.pipeline_id == pipeline_id, OutboxRow.sink == sink)).one()
    return progress or 0, highest


def add_publish_seconds(session: Session, pipeline_id: int, sink: str, after: int, last: int,
                        seconds: float) -> None:
    """Add `seconds` to `timings.publish_s` of each batch whose outbox rows of the sink lie in (after, last]."""
    session.execute(
        text("UPDATE batches SET timings = timings || jsonb_build_object('publish_s', "
             "round(CAST(coalesce((timings->>'publish_s')::float8, 0) + :s AS numeric), 3)) "
             "WHERE id IN (SELECT DISTINCT batch_id FROM outbox WHERE pipeline_id = :p AND sink = :k "
             "AND seq > :a AND seq <= :z)"),
        {"s": seconds, "p": pipeline_id, "k": sink, "a": after, "z": last},
    )


def batch_states(session: Session, pipeline_id: int) -> dict[int, BatchState]:
    """The state of every batch of the pipeline, by id."""
    rows = session.execute(select(Batch.id, Batch.state).where(Batch.pipeline_id == pipeline_id))
    return {batch_id: BatchState(state) for batch_id, state in rows}
