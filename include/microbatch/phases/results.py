"""What the stage, the commit and the publish phases return: plain values that `reporting` renders and
the Airflow tasks pass on. Kept apart from the phases so reporting imports no phase."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from microbatch.types import TopicPartition


@dataclass
class StageResult:
    batch_id: int
    attempt: int
    records_by_partition: dict[str, int]
    rows_by_sink: dict[str, int]
    dead_letters: int
    late_records: int
    state_after: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)
    """When the spec decodes or a sink is keyed by the record key: `formats` (each side's `Format.pins()`, what a
    replay must decode the same way), `undecodable` (dead letters among `dead_letters`) and `tombstones` (staged
    as deletes by the record-keyed sinks, not given to the job)."""

    @property
    def records(self) -> int:
        return sum(self.records_by_partition.values())


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
    outbox_labels: dict[str, str] = field(default_factory=dict)
    """Kafka sink -> what its outbox rows of this batch are (windows that became final, rows, corrections)."""
    watermark_before: int | None = None
    watermark_after: int | None = None
    replaced: list[tuple[int, str]] = field(default_factory=list)
    """Replay: (original batch id, range) of each committed range this batch superseded."""
    retracted_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class PublishResult:
    sink: str
    topic: str
    resumed_after: int
    last_seq: int
    records: int
    transactions: int
    seconds: float

    @property
    def first_seq(self) -> int:
        return self.resumed_after + 1
