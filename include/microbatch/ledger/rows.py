"""What the ledger records of each committed batch's rows, which `microbatch verify` holds the sinks' tables against.

The stage records the rows it handed each sink (`counts.rows_by_sink`); the commit records, for a sink that keeps
per-batch rows (an upsert's versions, an aggregate's contributions), how many it kept (`counts.kept_by_sink`); a
`microbatch reland` of a batch into one sink records the table commit it made (`counts.relands`). A batch whose
ranges a replay superseded in part is audited through the replay, not by itself: its own counts no longer
describe what the tables hold of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from microbatch.ledger.models import Batch, BatchState, Range
from microbatch.types import OffsetRange

ROWS = "rows_by_sink"
KEPT = "kept_by_sink"
RELANDS = "relands"


@dataclass(frozen=True)
class CommittedBatch:
    batch_id: int
    counts: Mapping[str, Any]
    ranges: list[OffsetRange]
    whole: bool
    """None of its ranges was superseded by a replay."""
    attempt: int = 0
    state_before: Mapping[str, Any] = field(default_factory=dict)
    formats: Mapping[str, Any] = field(default_factory=dict)
    """The registry schemas the batch decoded with (`batches.formats`)."""
    planned_us: int | None = None

    def recorded(self, key: str, sink: str) -> int | None:
        value = (self.counts.get(key) or {}).get(sink)
        return None if value is None else int(value)


def committed_batches(session: Session, pipeline_id: int) -> list[CommittedBatch]:
    """Every committed batch of the pipeline, by id, with its counts and its ranges."""
    batches = session.execute(select(Batch.id, Batch.counts, Batch.attempt, Batch.state_before, Batch.formats,
                                     Batch.created_at).where(
        Batch.pipeline_id == pipeline_id, Batch.state == BatchState.COMMITTED.value).order_by(Batch.id)).all()
    ranges: dict[int, list[OffsetRange]] = {}
    superseded: set[int] = set()
    for batch_id, topic, partition, start, end, committed in session.execute(
            select(Range.batch_id, Range.topic, Range.partition, Range.start_offset, Range.end_offset,
                   Range.committed).where(Range.pipeline_id == pipeline_id)):
        if committed:
            ranges.setdefault(batch_id, []).append(OffsetRange(topic, partition, start, end))
        else:
            superseded.add(batch_id)
    return [CommittedBatch(b, counts or {}, sorted(ranges.get(b, []), key=lambda r: (r.topic, r.partition, r.start)),
                           b not in superseded, attempt, state_before or {}, formats or {},
                           int(created.timestamp() * 1_000_000))
            for b, counts, attempt, state_before, formats, created in batches]


def record_kept(batch: Batch, kept: Mapping[str, int]) -> None:
    """Keep, on the batch being committed, the rows each `kept` sink kept for it."""
    if kept:
        batch.counts = {**batch.counts, KEPT: dict(kept)}


def record_reland(session: Session, batch_id: int, sink: str, version: int | None, rows: int) -> int:
    """Keep a reland of the batch into `sink` (the table version it made, if the sink has versions, and its rows);
    the number of this reland (1 for the batch's first into that sink)."""
    batch = session.get(Batch, batch_id, with_for_update=True)
    assert batch is not None, "a relanded batch is a committed batch"
    relands = dict(batch.counts.get(RELANDS) or {})
    done = [*relands.get(sink, []), {"version": version, "rows": rows, "at": datetime.now(UTC).isoformat()}]
    relands[sink] = done
    batch.counts = {**batch.counts, RELANDS: relands}
    return len(done)


def reland_count(session: Session, batch_id: int, sink: str) -> int:
    """How many relands of the batch into `sink` the ledger holds."""
    counts = session.scalar(select(Batch.counts).where(Batch.id == batch_id)) or {}
    return len((counts.get(RELANDS) or {}).get(sink, []))
