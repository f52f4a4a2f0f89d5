"""The outbox and its publisher: the SQL that writes a publishing sink's outbox rows in the commit, and the
publisher's reads and progress."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from microbatch.ledger.fragments import superseded_ranges
from microbatch.ledger.models import OutboxRow, PublishProgress

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
