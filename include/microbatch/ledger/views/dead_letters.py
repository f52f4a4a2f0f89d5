"""A pipeline's dead letters, filtered, with the committed range that holds each (`microbatch dead-letters`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session


@dataclass
class DeadLetterView:
    """One dead letter as `microbatch dead-letters` lists it, with the committed range of its batch that holds it
    (what a re-process replays)."""

    batch_id: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp: datetime | None
    error: str
    value: bytes | None
    """The first 200 bytes of the record's value."""
    range_start: int
    range_end: int


def dead_letters(
    session: Session, pipeline: int, *, batch_id: int | None = None, topic: str | None = None,
    partition: int | None = None, since: datetime | None = None, until: datetime | None = None,
    reason: str | None = None, limit: int | None = None,
) -> list[DeadLetterView]:
    """The pipeline's dead letters (those of its committed batches), by topic, partition and offset; filtered by
    batch, topic, partition, the record's Kafka timestamp (`since` inclusive, `until` exclusive) and a piece of the
    reason (case-insensitive)."""
    where = ["d.pipeline_id = :p"]
    params: dict[str, Any] = {"p": pipeline, "limit": limit}
    for column, name, value in (("d.batch_id", "b", batch_id), ("d.topic", "t", topic),
                                ("d.partition", "n", partition)):
        if value is not None:
            where.append(f"{column} = :{name}")
            params[name] = value
    if since is not None:
        where.append('d."timestamp" >= :since')
        params["since"] = since
    if until is not None:
        where.append('d."timestamp" < :until')
        params["until"] = until
    if reason:
        where.append("strpos(lower(d.error), lower(:reason)) > 0")
        params["reason"] = reason
    rows = session.execute(text(
        'SELECT d.batch_id, d.topic, d.partition, d."offset", d."key", d."timestamp", d.error, '
        "substring(d.raw FROM 1 FOR 200) AS value, r.start_offset, r.end_offset FROM dead_letters d "
        "JOIN ranges r ON r.batch_id = d.batch_id AND r.topic = d.topic AND r.partition = d.partition "
        "AND r.committed AND int8range(r.start_offset, r.end_offset) @> d.\"offset\" "
        f"WHERE {' AND '.join(where)} ORDER BY d.topic, d.partition, d.\"offset\" LIMIT :limit"), params).all()
    return [DeadLetterView(r.batch_id, r.topic, r.partition, r.offset, r.key, r.timestamp, r.error,
                           bytes(r.value) if r.value is not None else None, r.start_offset, r.end_offset)
            for r in rows]
