"""The stage's attempt of a batch: its next attempt number with all the stage needs (`begin_stage`), and the
attempt marked staged, unless a newer one superseded it (`record_staged`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from microbatch.errors import MicrobatchError, ZombieAttemptError
from microbatch.ledger.batches import batch_ranges, get_batch, open_predecessor
from microbatch.ledger.models import OPEN_STATES, Batch, BatchKind, BatchState
from microbatch.ledger.pipelines import pipeline_state, pipeline_uid
from microbatch.types import StageStart


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
