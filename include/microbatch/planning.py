"""Pure planning: ledger positions + broker offsets + policy -> the offset ranges of one batch.

No I/O here. Every function is deterministic in its arguments, so a replay of a plan
reads the same ranges, and the logic is unit-tested on its own (like Hudi's
`KafkaOffsetGen.computeOffsetRanges`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from microbatch.config import OnDataLoss, SourceSpec, Startup
from microbatch.errors import DataLossError, SpecError


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
class Plan:
    """What one batch will read, and what planning noticed on the way."""

    ranges: tuple[OffsetRange, ...]
    new_partitions: tuple[TopicPartition, ...] = ()
    gaps: tuple[Gap, ...] = ()
    backlog: Mapping[TopicPartition, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def lag_after(self) -> int:
        return sum(self.backlog.values()) - self.records


def resolve_starts(
    positions: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    source: SourceSpec,
) -> tuple[dict[TopicPartition, int], list[TopicPartition], list[Gap]]:
    """Decide where each discovered partition starts.

    A partition the ledger knows starts at its position. A new one starts by the startup
    mode. A position below the earliest offset is data loss: it fails the plan under
    `on_data_loss: fail`, and becomes a recorded gap under `skip`. Never a silent reset.
    """
    starts: dict[TopicPartition, int] = {}
    new: list[TopicPartition] = []
    gaps: list[Gap] = []
    for tp in sorted(latest):
        low, high = earliest[tp], latest[tp]
        if tp not in positions:
            new.append(tp)
            starts[tp] = low if source.startup is Startup.EARLIEST else high
            continue
        position = positions[tp]
        if position > high:
            raise DataLossError(
                f"{tp}: the ledger position {position} is beyond the latest offset {high}; "
                "the topic was probably deleted and re-created.",
                fix="Check the topic, then move the position with `microbatch reset`.",
            )
        if position < low:
            if source.on_data_loss is OnDataLoss.FAIL:
                raise DataLossError(
                    f"{tp}: offsets [{position}, {low}) were deleted by retention before they were read.",
                    fix="Restore them, or set source.on_data_loss: skip to record them as a gap and go on.",
                )
            gaps.append(Gap(tp.topic, tp.partition, position, low, "deleted by retention before it was read"))
            position = low
        starts[tp] = position
    return starts, new, gaps


def split_budget(backlog: Mapping[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """Share `limit` records across partitions in proportion to their backlog.

    Like Spark's `maxOffsetsPerTrigger`: each partition gets the floor of its share, and the
    remainder goes one by one to the largest fractional parts (ties broken by partition order),
    so the total is exactly `min(limit, sum(backlog))` and the result is deterministic.
    """
    if limit <= 0:
        raise SpecError("max_records_per_batch must be positive.")
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    shares = {tp: 0 for tp in backlog}
    remainders: list[tuple[int, TopicPartition]] = []
    for tp, size in backlog.items():
        quota, remainder = divmod(size * limit, total)
        shares[tp] = quota
        remainders.append((remainder, tp))
    leftover = limit - sum(shares.values())
    for _, tp in sorted(remainders, key=lambda item: (-item[0], item[1]))[:leftover]:
        shares[tp] += 1
    return shares


def plan_ranges(
    starts: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_records_per_batch: int,
) -> tuple[list[OffsetRange], dict[TopicPartition, int]]:
    """The non-empty ranges of the next batch, and the backlog per partition before it."""
    backlog = {tp: max(0, latest[tp] - start) for tp, start in starts.items()}
    budget = split_budget(backlog, max_records_per_batch)
    ranges = [
        OffsetRange(tp.topic, tp.partition, starts[tp], starts[tp] + budget[tp])
        for tp in sorted(starts)
        if budget[tp] > 0
    ]
    return ranges, backlog


def plan_batch(
    positions: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    source: SourceSpec,
) -> Plan:
    """Everything `plan` decides, from what it read: starts, data-loss policy and ranges."""
    starts, new, gaps = resolve_starts(positions, earliest, latest, source)
    ranges, backlog = plan_ranges(starts, latest, source.max_records_per_batch)
    return Plan(ranges=tuple(ranges), new_partitions=tuple(new), gaps=tuple(gaps), backlog=backlog)


def find_overlaps(ranges: list[OffsetRange]) -> list[tuple[OffsetRange, OffsetRange]]:
    """Pairs of ranges of the same partition that share an offset."""
    overlaps = []
    ordered = sorted(ranges)
    for before, after in pairwise(ordered):
        if before.tp == after.tp and after.start < before.end:
            overlaps.append((before, after))
    return overlaps


def find_holes(ranges: list[OffsetRange], gaps: list[Gap], positions: Mapping[TopicPartition, int]) -> list[str]:
    """Offsets below each position that neither a committed range nor a gap covers."""
    covered: dict[TopicPartition, list[tuple[int, int]]] = {}
    for r in ranges:
        covered.setdefault(r.tp, []).append((r.start, r.end))
    for g in gaps:
        covered.setdefault(TopicPartition(g.topic, g.partition), []).append((g.start, g.end))
    problems = []
    for tp, spans in sorted(covered.items()):
        spans.sort()
        cursor = spans[0][0]
        for start, end in spans:
            if start > cursor:
                problems.append(f"{tp}: offsets [{cursor}, {start}) are in no committed range and no gap")
            cursor = max(cursor, end)
        position = positions.get(tp)
        if position is not None and position != cursor:
            problems.append(f"{tp}: the position is {position} but the committed ranges end at {cursor}")
    return problems
