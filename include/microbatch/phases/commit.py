"""The commit phase (Flink's `notifyCheckpointComplete` -> `commit`), in ONE transaction:
lock the batch and its pipeline, compare-and-set every position, mark its ranges committed
(the exclusion constraint refuses overlaps), merge staged rows into the sinks with set-based
SQL and keep them as this batch's per-partition contributions, move dead letters and late
records, write an outbox row per window that became final, update the pipeline state, mark the
batch committed and delete its staging rows.

A replay batch first marks the committed ranges it replaces as superseded (kept for the audit)
and retracts their contributions, their dead letters and late records, then adds its own, and
publishes the final windows whose value changed as corrections; all in the same transaction.

`commit_batch` takes the caller's session and never commits: the caller's COMMIT is the
single point where the batch becomes visible (invariant 2).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from microbatch import failpoints
from microbatch.config import KafkaSink, PipelineSpec, PostgresAggregateSink
from microbatch.errors import ConcurrentCommitError, MicrobatchError, ZombieAttemptError
from microbatch.ledger import repository as repo
from microbatch.ledger.models import BACKFILL_KINDS, BatchKind, BatchState, Range
from microbatch.types import TopicPartition

log = logging.getLogger(__name__)


@dataclass
class PositionMove:
    tp: TopicPartition
    before: int | None
    after: int


@dataclass
class CommitResult:
    batch_id: int
    attempt: int
    already_committed: bool = False
    moves: list[PositionMove] = field(default_factory=list)
    rows_by_sink: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    late_records: int = 0
    outbox: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Kafka sink -> (first, last) outbox sequence written by this batch."""
    watermark_before: int | None = None
    watermark_after: int | None = None
    replaced: list[tuple[int, str]] = field(default_factory=list)
    """Replay: (original batch id, range) of each committed range this batch superseded."""
    retracted_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _quote(identifier: str) -> str:
    # Identifiers come from a validated spec (lower-case SQL identifiers); quoting is belt and braces.
    return '"' + identifier.replace('"', '""') + '"'


def merge_aggregate_sql(sink: PostgresAggregateSink) -> str:
    """Set-based merge of one batch's staged partial aggregates into the sink table."""
    keys = ", ".join(_quote(k) for k in sink.keys)
    sums = ", ".join(f"sum({_quote(c)})" for c in sink.sum_columns)
    updates = ", ".join(
        f"{_quote(c)} = {_quote(sink.table)}.{_quote(c)} + EXCLUDED.{_quote(c)}" for c in sink.sum_columns
    )
    return (
        f"INSERT INTO {_quote(sink.table)} ({keys}, {', '.join(_quote(c) for c in sink.sum_columns)}) "
        f"SELECT {keys}, {sums} FROM {_quote(sink.staging_table)} "
        f"WHERE batch_id = :batch_id AND attempt = :attempt GROUP BY {keys} "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates}"
    )


def contributions_sql(sink: PostgresAggregateSink) -> str:
    """Keep this batch's staged partial aggregates per source partition (what a replay retracts)."""
    group = ", ".join(_quote(c) for c in ("topic", "partition", *sink.keys))
    sums = ", ".join(f"sum({_quote(c)})" for c in sink.sum_columns)
    columns = ", ".join(_quote(c) for c in ("topic", "partition", *sink.columns))
    return (
        f"INSERT INTO {_quote(sink.contributions_table)} (batch_id, {columns}) "
        f"SELECT :batch_id, {group}, {sums} FROM {_quote(sink.staging_table)} "
        f"WHERE batch_id = :batch_id AND attempt = :attempt GROUP BY {group}"
    )


def _replaced_sums(sink: PostgresAggregateSink) -> str:
    """The summed contributions of the ranges that the replay batch :batch_id superseded."""
    keys = ", ".join(f"c.{_quote(k)}" for k in sink.keys)
    sums = ", ".join(f"sum(c.{_quote(c)}) AS {_quote(c)}" for c in sink.sum_columns)
    return (
        f"SELECT {keys}, {sums} FROM {_quote(sink.contributions_table)} c JOIN ranges g "
        "ON g.batch_id = c.batch_id AND g.topic = c.topic AND g.partition = c.partition "
        f"WHERE g.superseded_by = :batch_id GROUP BY {keys}"
    )


def retract_sql(sink: PostgresAggregateSink) -> str:
    """Subtract the superseded contributions from the sink table."""
    updates = ", ".join(f"{_quote(c)} = s.{_quote(c)} - r.{_quote(c)}" for c in sink.sum_columns)
    match = " AND ".join(f"s.{_quote(k)} = r.{_quote(k)}" for k in sink.keys)
    return f"UPDATE {_quote(sink.table)} AS s SET {updates} FROM ({_replaced_sums(sink)}) AS r WHERE {match}"


def drop_emptied_sql(sink: PostgresAggregateSink) -> str:
    """Rows that only the superseded contributions held, now all zero, are removed."""
    match = " AND ".join(f"s.{_quote(k)} = r.{_quote(k)}" for k in sink.keys)
    zero = " AND ".join(f"s.{_quote(c)} = 0" for c in sink.sum_columns)
    return f"DELETE FROM {_quote(sink.table)} AS s USING ({_replaced_sums(sink)}) AS r WHERE {match} AND {zero}"


def replay_corrections_sql(sink: KafkaSink, source: PostgresAggregateSink) -> str:
    """Outbox rows, marked as corrections, for the final windows whose value the replay changed
    (a key the replay emptied is published with zero)."""
    assert source.window is not None
    keys = ", ".join(_quote(k) for k in source.keys)
    sums = ", ".join(f"sum({_quote(c)}) AS {_quote(c)}" for c in source.sum_columns)
    differs = " OR ".join(
        f"coalesce(new.{_quote(c)}, 0) <> coalesce(old.{_quote(c)}, 0)" for c in source.sum_columns)
    values = ", ".join(f"coalesce(s.{_quote(c)}, 0) AS {_quote(c)}" for c in source.sum_columns)
    return (
        f"WITH new AS (SELECT {keys}, {sums} FROM {_quote(source.staging_table)} "
        f"WHERE batch_id = :batch_id AND attempt = :attempt GROUP BY {keys}), "
        f"old AS ({_replaced_sums(source)}), "
        f"changed AS (SELECT {keys} FROM new FULL JOIN old USING ({keys}) WHERE {differs}), "
        f"final AS (SELECT {keys}, {values} FROM changed LEFT JOIN {_quote(source.table)} s USING ({keys}) "
        f"WHERE {_quote(source.window.end)} <= :high) "
        "INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) "
        f"SELECT :pipeline_id, :sink, base.seq + row_number() OVER (ORDER BY {keys}), :batch_id, "
        f"final.{_quote(sink.key)}::text, to_jsonb(final) || jsonb_build_object('correction', true) "
        "FROM final, (SELECT coalesce(max(seq), 0) AS seq FROM outbox "
        "WHERE pipeline_id = :pipeline_id AND sink = :sink) AS base "
        "RETURNING seq"
    )


def _supersede(session: Session, batch, ranges: list) -> list[tuple[int, str]]:  # noqa: ANN001
    """Mark the committed ranges a replay batch replaces as superseded by it, after checking that
    they are still the committed ones (another replay may have replaced them since the plan)."""
    ids = list(batch.replaces or [])
    rows = session.scalars(select(Range).where(Range.id.in_(ids)).order_by(Range.id).with_for_update()).all()
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
    session.execute(
        text("UPDATE ranges SET committed = false, superseded_by = :b WHERE id = ANY(:ids)"),
        {"b": batch.id, "ids": ids},
    )
    for table in ("dead_letters", "late_records"):
        session.execute(
            text(f"DELETE FROM {table} d USING ranges g WHERE g.superseded_by = :b AND d.batch_id = g.batch_id "
                 "AND d.topic = g.topic AND d.partition = g.partition"),
            {"b": batch.id},
        )
    return [(r.batch_id, f"{r.topic}[{r.partition}] [{r.start_offset}, {r.end_offset})") for r in rows]


def outbox_sql(sink: KafkaSink, source: PostgresAggregateSink) -> str:
    """One outbox row per key of each window of `source` that became final in this batch, in
    a stable order, numbered after the sink's last sequence (gap-free; the pipeline row is locked)."""
    assert source.window is not None
    window_end = _quote(source.window.end)
    order = ", ".join(_quote(k) for k in source.keys)
    columns = ", ".join(_quote(c) for c in source.columns)
    return (
        "INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) "
        "SELECT :pipeline_id, :sink, base.seq + row_number() OVER (ORDER BY " + order + "), :batch_id, "
        f"final.{_quote(sink.key)}::text, to_jsonb(final) "
        f"FROM (SELECT {columns} FROM {_quote(source.table)} "
        f"WHERE {window_end} > coalesce(:low, '-infinity'::timestamptz) AND {window_end} <= :high) AS final, "
        "(SELECT coalesce(max(seq), 0) AS seq FROM outbox WHERE pipeline_id = :pipeline_id AND sink = :sink) AS base "
        "RETURNING seq"
    )


def corrections_sql(sink: KafkaSink, source: PostgresAggregateSink) -> str:
    """Outbox rows for the final windows that a backfill batch changed, marked as corrections."""
    assert source.window is not None
    keys = ", ".join(_quote(k) for k in source.keys)
    columns = ", ".join(f"s.{_quote(c)}" for c in source.columns)
    return (
        "INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) "
        f"SELECT :pipeline_id, :sink, base.seq + row_number() OVER (ORDER BY {keys}), :batch_id, "
        f"final.{_quote(sink.key)}::text, to_jsonb(final) || jsonb_build_object('correction', true) "
        f"FROM (SELECT {columns} FROM {_quote(source.table)} s "
        f"WHERE ({', '.join(f's.{_quote(k)}' for k in source.keys)}) IN "
        f"(SELECT {keys} FROM {_quote(source.staging_table)} WHERE batch_id = :batch_id AND attempt = :attempt) "
        f"AND s.{_quote(source.window.end)} <= :high) AS final, "
        "(SELECT coalesce(max(seq), 0) AS seq FROM outbox WHERE pipeline_id = :pipeline_id AND sink = :sink) AS base "
        "RETURNING seq"
    )


def _check_below_positions(session: Session, pipeline_id: int, batch_id: int, ranges: list) -> None:
    """A backfill may only commit offsets the scheduled cursor has passed; later ones belong to it."""
    positions = repo.read_positions(session, pipeline_id)
    for r in ranges:
        if r.end > positions.get(r.tp, 0):
            raise ConcurrentCommitError(
                f"Backfill batch {batch_id} reaches {r} but the scheduled position of {r.tp} is "
                f"{positions.get(r.tp, 0)}; those offsets belong to the scheduled runs.",
                fix="Nothing was written. Re-plan the backfill below the current position.",
            )


def _micros_to_timestamp(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1_000_000, tz=UTC)


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
    if batch.state != BatchState.STAGED.value or batch.staged_attempt != batch.attempt:
        raise ZombieAttemptError(
            f"Batch {batch_id} is {batch.state} at attempt {batch.attempt}, not staged by its current attempt; "
            "a newer attempt owns it.",
            fix="Let the newer attempt finish; this run's staged rows are discarded.",
        )
    attempt = batch.attempt
    pipeline = repo.get_pipeline(session, spec.name, lock=True)  # serializes commits of one pipeline
    if pipeline is None or pipeline.id != batch.pipeline_id:
        raise MicrobatchError(f"Batch {batch_id} does not belong to pipeline {spec.name}.", fix="Check the batch id.")

    ranges = repo.batch_ranges(session, batch_id)
    backfill = batch.kind in BACKFILL_KINDS
    replay = batch.kind == BatchKind.REPLAY.value
    if backfill:
        _check_below_positions(session, pipeline.id, batch_id, ranges)
    if replay:
        result.replaced = _supersede(session, batch, ranges)
    gaps = {(g.topic, g.partition): g for g in repo.batch_gaps(session, batch_id)}
    ends = {r.tp: r for r in ranges}
    for tp in sorted(set(ends) | {TopicPartition(*key) for key in gaps}):
        if backfill:
            break  # a backfill never moves the scheduled cursor
        gap = gaps.get((tp.topic, tp.partition))
        rng = ends.get(tp)
        start = gap.start if gap else rng.start  # type: ignore[union-attr]
        end = rng.end if rng else gap.end  # type: ignore[union-attr]
        before = _compare_and_set(session, pipeline.id, batch_id, tp, start, end)
        result.moves.append(PositionMove(tp, before, end))

    try:
        with session.begin_nested():
            session.execute(text("UPDATE ranges SET committed = true WHERE batch_id = :b"), {"b": batch_id})
    except IntegrityError:
        raise ConcurrentCommitError(
            f"Batch {batch_id} overlaps offsets that another batch already committed; the database refused it.",
            fix="Nothing was written. Inspect the batch with `microbatch history`.",
        ) from None

    staged_rows = dict(batch.counts.get("rows_by_sink", {}))
    params = {"batch_id": batch_id, "attempt": attempt}
    for sink in spec.aggregate_sinks:
        found = session.execute(
            text(
                f"SELECT count(*) FROM {_quote(sink.staging_table)} "
                "WHERE batch_id = :batch_id AND attempt = :attempt"
            ),
            params,
        ).scalar_one()
        if found != staged_rows.get(sink.name, 0):
            raise MicrobatchError(
                f"Batch {batch_id} attempt {attempt}: {found} rows are staged for sink {sink.name} "
                f"but the stage recorded {staged_rows.get(sink.name, 0)}.",
                fix="Nothing was written; the retry stages the batch again.",
            )
        if replay:
            result.retracted_rows[sink.name] = session.execute(
                text(retract_sql(sink)), {"batch_id": batch_id}).rowcount
        result.rows_by_sink[sink.name] = session.execute(text(merge_aggregate_sql(sink)), params).rowcount
        session.execute(text(contributions_sql(sink)), params)
        if replay:
            session.execute(text(drop_emptied_sql(sink)), {"batch_id": batch_id})
    result.dead_letters = session.execute(
        text(
            'INSERT INTO dead_letters (pipeline_id, batch_id, topic, partition, "offset", raw, error) '
            'SELECT :pipeline_id, batch_id, topic, partition, "offset", raw, error FROM stage_dead_letters '
            "WHERE batch_id = :batch_id AND attempt = :attempt"
        ),
        {**params, "pipeline_id": pipeline.id},
    ).rowcount

    result.late_records = session.execute(
        text(
            'INSERT INTO late_records (pipeline_id, batch_id, topic, partition, "offset", event_time, raw, watermark) '
            'SELECT :pipeline_id, batch_id, topic, partition, "offset", event_time, raw, :watermark '
            "FROM stage_late_records WHERE batch_id = :batch_id AND attempt = :attempt"
        ),
        {**params, "pipeline_id": pipeline.id,
         "watermark": _micros_to_timestamp((batch.state_before or {}).get("watermark_us"))},
    ).rowcount
    sources = {s.name: s for s in spec.aggregate_sinks}
    if backfill:
        # History changes windows that may already be published: publish them again as corrections.
        result.watermark_before = result.watermark_after = (pipeline.state or {}).get("watermark_us")
        if result.watermark_after is not None:
            for kafka_sink in spec.kafka_sinks:
                make_sql = replay_corrections_sql if replay else corrections_sql
                seqs = session.execute(
                    text(make_sql(kafka_sink, sources[kafka_sink.source])),
                    {"pipeline_id": pipeline.id, "sink": kafka_sink.name, "batch_id": batch_id, "attempt": attempt,
                     "high": _micros_to_timestamp(result.watermark_after)},
                ).scalars().all()
                if seqs:
                    result.outbox[kafka_sink.name] = (min(seqs), max(seqs))
    else:
        result.watermark_before = (batch.state_before or {}).get("watermark_us")
        result.watermark_after = (batch.state_after or {}).get("watermark_us")
    if not backfill and result.watermark_after is not None and result.watermark_after != result.watermark_before:
        for kafka_sink in spec.kafka_sinks:
            seqs = session.execute(
                text(outbox_sql(kafka_sink, sources[kafka_sink.source])),
                {"pipeline_id": pipeline.id, "sink": kafka_sink.name, "batch_id": batch_id,
                 "low": _micros_to_timestamp(result.watermark_before),
                 "high": _micros_to_timestamp(result.watermark_after)},
            ).scalars().all()
            if seqs:
                result.outbox[kafka_sink.name] = (min(seqs), max(seqs))

    if not backfill:
        pipeline.state = dict(batch.state_after or {})
    batch.state = BatchState.COMMITTED.value
    batch.counts = {**batch.counts, "contributions": True}
    batch.committed_at = session.execute(text("SELECT now()")).scalar_one()
    batch.committed_run_id = run_id
    for table in [sink.staging_table for sink in spec.aggregate_sinks] + ["stage_dead_letters", "stage_late_records"]:
        session.execute(text(f"DELETE FROM {_quote(table)} WHERE batch_id = :batch_id"), params)
    result.seconds = time.monotonic() - started
    batch.timings = {**batch.timings, "commit_s": round(result.seconds, 3)}
    session.flush()
    failpoints.hit("commit.before_commit")
    return result
