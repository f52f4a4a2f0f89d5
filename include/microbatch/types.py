"""Value types shared by every layer: partitions, offset ranges, gaps, plans, committed ranges.

Plain frozen dataclasses with no behaviour beyond their own fields, so the planner, the Kafka clients,
the ledger and the phases can all speak of the same things without importing one another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True, order=True)
class OffsetRange:
    """The half-open offset range [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] [{self.start}, {self.end})"


@dataclass(frozen=True)
class Gap:
    """Offsets lost before they were read (retention), recorded under `on_data_loss: skip`."""

    topic: str
    partition: int
    start: int
    end: int
    reason: str


@dataclass(frozen=True)
class StartupOffsets:
    """What the broker answered for the startup modes of new partitions (read only when needed).

    `committed`: the takeover group's committed offset per partition (None: it has none).
    `for_time`: the first offset at or after `startup.timestamp` (None: no such record).
    """

    committed: Mapping[TopicPartition, int | None] = field(default_factory=dict)
    for_time: Mapping[TopicPartition, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What one batch will read, and what planning noticed on the way."""

    ranges: tuple[OffsetRange, ...]
    new_partitions: tuple[TopicPartition, ...] = ()
    gaps: tuple[Gap, ...] = ()
    backlog: Mapping[TopicPartition, int] = field(default_factory=dict)
    """Offsets between each partition's start and the latest (stable) offset, before this batch."""
    starts: Mapping[TopicPartition, int] = field(default_factory=dict)
    """Where each discovered partition starts (its ledger position, or its resolved startup offset)."""
    startup: Mapping[TopicPartition, str] = field(default_factory=dict)
    """How each new partition's start was chosen, for the log."""
    disappeared_topics: tuple[str, ...] = ()
    """Topics the ledger has positions for that the broker no longer lists; their rows are kept."""
    deferred: str | None = None
    """Why no batch runs although records are waiting (`min_records_per_batch`), else None."""

    @property
    def records(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def lag_after(self) -> int:
        return sum(self.backlog.values()) - self.records

    def lag_after_by_partition(self) -> dict[TopicPartition, int]:
        """Offsets each partition still has to read after this batch."""
        read = {r.tp: r.size for r in self.ranges}
        return {tp: lag - read.get(tp, 0) for tp, lag in sorted(self.backlog.items())}


@dataclass(frozen=True)
class CommittedRange:
    """A committed range of the ledger, with its row id and the batch that committed it."""

    range_id: int
    batch_id: int
    range: OffsetRange


@dataclass(frozen=True)
class BackfillLedger:
    """What a backfill reads from the ledger before it plans, in one transaction (under the pipeline's lock)."""

    positions: Mapping[TopicPartition, int]
    committed: list[OffsetRange]
    committed_rows: list[CommittedRange]
    """Replay only: the committed ranges with their row and batch ids."""
    open_ranges: list[tuple[int, str, OffsetRange]]
    """(batch id, state, range) of every batch still open."""
    without_contributions: list[int]
    """Replay only: the committed batches whose per-partition contributions were not kept, ascending."""


@dataclass(frozen=True)
class BackfillBatch:
    """One batch a backfill inserts: its ranges and, for a replay, the batch it replays and the range rows it
    replaces."""

    ranges: tuple[OffsetRange, ...]
    original: int | None = None
    replaces: tuple[int, ...] = ()


@dataclass(frozen=True)
class OpenBatch:
    """A scheduled batch still open (planned or staged), with its ranges: the plan runs it again."""

    batch_id: int
    planned: bool
    """Not staged yet: only then can retention have deleted offsets it has still to read."""
    ranges: list[OffsetRange]


@dataclass(frozen=True)
class PlanningLedger:
    """What the plan reads from the ledger in one transaction, under the pipeline's lock."""

    open_batches: list[OpenBatch]
    positions: Mapping[TopicPartition, int]
    waited_seconds: float
    """Seconds since the pipeline's last batch was planned (or since its row was created)."""


@dataclass(frozen=True)
class StageStart:
    """What the stage reads and takes from the ledger as it begins an attempt at a batch (under its stage lock)."""

    state: str
    """The batch's state when it was read."""
    staged_attempt: int | None
    attempt: int | None
    """The attempt this stage took; None when there is nothing to stage (see `state`)."""
    ranges: list[OffsetRange] = field(default_factory=list)
    state_before: dict = field(default_factory=dict)
    """The pipeline state the batch starts from, fixed as the attempt begins."""
    holes: bool = False
    """The pipeline's last read had holes (transaction markers): count per partition in the same pass."""
    pipeline_id: int = 0
    pipeline_uid: str = ""
    """The ledger's identity of the pipeline, which a lakehouse sink's table commit carries."""
    formats: dict = field(default_factory=dict)
    """The pins of the batch's registry formats, by side (`ledger.models.Batch.formats`)."""
    planned_us: int | None = None
    """When the batch was planned (microseconds since the epoch): the clock that an event time without a Kafka
    timestamp beside it is held against, the same in every attempt and replay of the batch's records."""


@dataclass(frozen=True)
class TableWrite:
    """What a sink that writes its table in the stage found there or wrote: the version that holds the batch."""

    location: str
    version: int
    rows: int
    attempt: int
    """The attempt that wrote the version (an earlier one when this attempt found the batch already there)."""
    wrote: bool


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros_time(micros: int | None) -> datetime | None:
    """A time of the pipeline state (microseconds since the epoch) as an exact UTC datetime; None when there is none
    or no datetime can hold it (past year 9999, as a runaway watermark)."""
    if micros is None:
        return None
    try:
        return EPOCH + timedelta(microseconds=int(micros))
    except OverflowError:
        return None

