"""A pipeline's positions: the next offset of each partition it reads.

Every write to `positions` is here, and nowhere else: the plan pins the start of new partitions
(`pin_new_positions`), the commit advances by compare-and-set (`advance_position`), and an operator's
reset moves one on the record (`reset_position`)."""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from microbatch.errors import ConcurrentCommitError
from microbatch.ledger.models import Position
from microbatch.ledger.pipelines import get_pipeline
from microbatch.types import TopicPartition


def read_positions(session: Session, pipeline_id: int) -> dict[TopicPartition, int]:
    """The next offset of every partition the ledger has seen."""
    rows = session.execute(
        select(Position.topic, Position.partition, Position.next_offset).where(Position.pipeline_id == pipeline_id)
    )
    return {TopicPartition(topic, partition): offset for topic, partition, offset in rows}


def known_positions(session: Session, name: str) -> dict[TopicPartition, int]:
    """The positions of the pipeline named `name`, read only (none if the ledger has never seen it)."""
    pipeline = get_pipeline(session, name)
    return read_positions(session, pipeline.id) if pipeline is not None else {}


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
