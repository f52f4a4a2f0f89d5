"""The commit phase (Flink's `notifyCheckpointComplete` -> `commit`), in ONE transaction:
lock the batch and its pipeline, compare-and-set every position, mark its ranges committed
(the exclusion constraint refuses overlaps), merge staged rows into the sinks, move dead letters
and late records, write the outbox rows of the sinks that publish, update the pipeline state,
mark the batch committed and delete its staging rows.

A replay batch first marks the committed ranges it replaces as superseded (kept for the audit),
deletes their dead letters and late records, and has every sink retract their contributions
before it merges its own; all in the same transaction.

The sinks do their part through the interface of `microbatch.sinks.base.Sink`, so this module
knows no sink type. `commit_batch` takes the caller's session and never commits: the caller's
COMMIT is the single point where the batch becomes visible (invariant 2).
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch import failpoints
from microbatch.config import PipelineSpec
from microbatch.errors import ConcurrentCommitError, MicrobatchError, RowCountError, ZombieAttemptError
from microbatch.ledger import repository as repo
from microbatch.ledger import rows
from microbatch.ledger.models import BACKFILL_KINDS, Batch, BatchKind, BatchState, Pipeline
from microbatch.phases.results import CommitResult, PositionMove
from microbatch.sinks.base import CommitContext, watermark_timestamp
from microbatch.sinks.capabilities import LakeTable, Publisher
from microbatch.sinks.registry import sinks_of
from microbatch.types import Gap, OffsetRange, TopicPartition

COMMIT_WORK_MEM = "64MB"
BEFORE_COMMIT = failpoints.point("commit.before_commit")  # transaction open
AFTER_COMMIT = failpoints.point("commit.after_commit")  # hit by the commit task, after COMMIT

log = logging.getLogger(__name__)


def _supersede(session: Session, batch: Batch, ranges: list[OffsetRange]) -> list[tuple[int, str]]:
    """Mark the committed ranges a replay batch replaces as superseded by it, after checking that
    they are still the committed ones (another replay may have replaced them since the plan)."""
    ids = list(batch.replaces or [])
    rows = repo.lock_ranges(session, ids)
    stale = [r for r in rows if not r.committed or r.superseded_by is not None]
    if stale or len(rows) != len(ids):
        by = stale[0].superseded_by if stale else None
        raise ConcurrentCommitError(
            f"Replay batch {batch.id}: a range it replaces is no longer committed"
            f"{f' (batch {by} replaced it first)' if by else ''}.",
            fix="Nothing was written. Plan the replay again; it will replace the current ranges.",
        )
    extent = sorted((r.topic, r.partition, r.start_offset, r.end_offset) for r in rows)
    if extent != sorted((r.topic, r.partition, r.start, r.end) for r in ranges):
        raise MicrobatchError(f"Replay batch {batch.id} reads other offsets than the ranges it replaces.",
                              fix="Nothing was written. Plan the replay again.")
    repo.supersede_ranges(session, batch.id, ids)
    return [(r.batch_id, f"{r.topic}[{r.partition}] [{r.start_offset}, {r.end_offset})") for r in rows]


def _check_below_positions(session: Session, pipeline_id: int, batch_id: int, ranges: list[OffsetRange]) -> None:
    """A backfill may only commit offsets the scheduled cursor has passed; later ones belong to it."""
    positions = repo.read_positions(session, pipeline_id)
    for r in ranges:
        if r.end > positions.get(r.tp, 0):
            raise ConcurrentCommitError(
                f"Backfill batch {batch_id} reaches {r} but the scheduled position of {r.tp} is "
                f"{positions.get(r.tp, 0)}; those offsets belong to the scheduled runs.",
                fix="Nothing was written. Re-plan the backfill below the current position.",
            )


def _compare_and_set(
    session: Session, pipeline_id: int, batch_id: int, tp: TopicPartition, start: int, end: int
) -> int | None:
    """Move one position from `start` to `end`; a partition never seen before gets its first row."""
    return repo.advance_position(session, pipeline_id, batch_id, tp, start, end)




def commit_batch(session: Session, spec: PipelineSpec, batch_id: int, run_id: str | None = None) -> CommitResult:
    """Commit a staged batch inside the caller's transaction; a committed batch is a no-op. `run_id` is the
    Airflow run of the committing task, recorded beside the run that planned the batch."""
    started = time.monotonic()
    batch = repo.get_batch(session, batch_id, lock=True)
    result = CommitResult(batch_id=batch_id, attempt=batch.attempt)
    if batch.state == BatchState.COMMITTED.value:
        result.already_committed = True
        return result
    pipeline = _lock_pipeline(session, spec, batch)
    if batch.kind not in BACKFILL_KINDS:
        _check_starting_state(session, batch, pipeline)
    # The merges group a batch's staged rows by key: room to sort them in memory (the default 4 MB spilled
    # 80,000 rows to disk; bench/commit_cost.py --explain). Only this transaction's sorts and hashes use it.
    session.execute(text(f"SET LOCAL work_mem = '{COMMIT_WORK_MEM}'"))
    ctx = _context(spec, batch, pipeline)
    result.watermark_before, result.watermark_after = ctx.watermark_before, ctx.watermark_after

    ranges = repo.batch_ranges(session, batch_id)
    if ctx.backfill:
        _check_below_positions(session, pipeline.id, batch_id, ranges)
    if ctx.replay:
        result.replaced = _supersede(session, batch, ranges)
    gaps = repo.batch_gaps(session, batch_id)
    if not ctx.backfill:  # a backfill never moves the scheduled cursor
        result.moves = _advance_positions(session, ctx, ranges, gaps)
    repo.commit_ranges(session, batch_id)
    _merge_sinks(session, ctx, batch, result)
    _move_bad_records(session, ctx, batch, result)
    _write_outbox(session, ctx, result)
    _finish(session, ctx, batch, pipeline, run_id)
    result.seconds = time.monotonic() - started
    batch.timings = {**batch.timings, "commit_s": round(result.seconds, 3)}
    session.flush()
    BEFORE_COMMIT.hit()
    return result


def _lock_pipeline(session: Session, spec: PipelineSpec, batch: Batch) -> Pipeline:
    """Check that the batch is staged by its current attempt (else this run is a zombie), then lock its
    pipeline's row, which serializes the commits of one pipeline."""
    if batch.state != BatchState.STAGED.value or batch.staged_attempt != batch.attempt:
        raise ZombieAttemptError(
            f"Batch {batch.id} is {batch.state} at attempt {batch.attempt}, not staged by its current attempt; "
            "a newer attempt owns it.",
            fix="Let the newer attempt finish; this run's staged rows are discarded.",
        )
    pipeline = repo.get_pipeline(session, spec.name, lock=True)
    if pipeline is None or pipeline.id != batch.pipeline_id:
        raise MicrobatchError(f"Batch {batch.id} does not belong to pipeline {spec.name}.", fix="Check the batch id.")
    return pipeline


def _context(spec: PipelineSpec, batch: Batch, pipeline: Pipeline) -> CommitContext:
    """What the sinks see of this batch. A backfill leaves the watermark where the pipeline has it."""
    backfill = batch.kind in BACKFILL_KINDS
    if backfill:
        before = after = (pipeline.state or {}).get("watermark_us")
    else:
        before = (batch.state_before or {}).get("watermark_us")
        after = (batch.state_after or {}).get("watermark_us")
    return CommitContext(
        pipeline_id=pipeline.id, batch_id=batch.id, attempt=batch.attempt, backfill=backfill,
        replay=batch.kind == BatchKind.REPLAY.value, watermark_before=before, watermark_after=after,
        sinks=sinks_of(spec),
    )


def _check_starting_state(session: Session, batch: Batch, pipeline: Pipeline) -> None:
    """A scheduled batch commits on the state it was staged from: the batch before it in its run is committed, and
    the pipeline's state is the one this batch started from."""
    before = repo.open_predecessor(session, batch)
    if before is not None:
        raise MicrobatchError(f"Batch {batch.id} starts where batch {before.id} ends, and batch {before.id} is not "
                              "committed yet.", fix=f"Nothing was written. Commit batch {before.id} first.")
    if dict(batch.state_before or {}) != dict(pipeline.state or {}):
        raise MicrobatchError(
            f"Batch {batch.id} was staged from the pipeline state {batch.state_before}, but the committed state is "
            f"now {pipeline.state}.",
            fix=f"Nothing was written. Stage batch {batch.id} again (clear its stage task), then commit it.",
        )


def _advance_positions(
    session: Session, ctx: CommitContext, ranges: list[OffsetRange], gaps: list[Gap]
) -> list[PositionMove]:
    """Compare-and-set the position of every partition the batch read or skipped (a gap), in order."""
    by_partition = {(g.topic, g.partition): g for g in gaps}
    ends = {r.tp: r for r in ranges}
    moves = []
    for tp in sorted(set(ends) | {TopicPartition(*key) for key in by_partition}):
        gap = by_partition.get((tp.topic, tp.partition))
        rng = ends.get(tp)
        start = gap.start if gap else rng.start  # type: ignore[union-attr]
        end = rng.end if rng else gap.end  # type: ignore[union-attr]
        before = _compare_and_set(session, ctx.pipeline_id, ctx.batch_id, tp, start, end)
        moves.append(PositionMove(tp, before, end))
    return moves


def _merge_sinks(session: Session, ctx: CommitContext, batch: Batch, result: CommitResult) -> None:
    """Each sink in spec order: check its staged rows against the stage's count, retract what a replay
    supersedes, merge."""
    staged_rows = dict(batch.counts.get(rows.ROWS, {}))
    kept: dict[str, int] = {}
    for sink in ctx.sinks.values():
        sink.check_staged(session, ctx, staged_rows.get(sink.name, 0))
        if ctx.replay:
            retracted = sink.retract(session, ctx)
            if retracted is not None:
                result.retracted_rows[sink.name] = retracted
        merged = sink.merge(session, ctx)
        if merged is not None:
            result.rows_by_sink[sink.name] = merged
        appended = sink.row_audit == "coordinates" and not isinstance(sink, LakeTable)
        if appended and merged is not None and merged != staged_rows.get(sink.name, 0):
            raise RowCountError(
                f"Batch {ctx.batch_id}: sink {sink.name} merged {merged} rows but {staged_rows.get(sink.name, 0)} "
                "were staged; nothing was committed.", fix="The retry commits the batch again.")
        kept_rows = sink.kept_rows(session, ctx)
        if kept_rows is not None:
            kept[sink.name] = kept_rows
    rows.record_kept(batch, kept)


def _move_bad_records(session: Session, ctx: CommitContext, batch: Batch, result: CommitResult) -> None:
    """Staged dead letters and late records into their tables; a late record keeps the watermark that made
    it late (the batch's own start, even for a backfill)."""
    result.dead_letters, result.late_records = repo.move_staged_bad_records(
        session, ctx.pipeline_id, ctx.batch_id, ctx.attempt,
        watermark_timestamp((batch.state_before or {}).get("watermark_us")))


def _write_outbox(session: Session, ctx: CommitContext, result: CommitResult) -> None:
    """The outbox rows of every sink that publishes: final windows, or corrections of a backfill."""
    for sink in [s for s in ctx.sinks.values() if isinstance(s, Publisher)]:
        seqs = sink.write_outbox(session, ctx)
        if seqs is not None:
            result.outbox[sink.name] = seqs
            result.outbox_labels[sink.name] = sink.outbox_label(ctx)


def _finish(session: Session, ctx: CommitContext, batch: Batch, pipeline: Pipeline, run_id: str | None) -> None:
    """Advance the pipeline state (not for a backfill), mark the batch committed and delete its staged rows."""
    repo.mark_committed(session, batch, pipeline, run_id, advance_state=not ctx.backfill)
    for sink in ctx.sinks.values():
        sink.clear_staging(session, ctx)
    repo.clear_staged_bad_records(session, ctx.batch_id)
