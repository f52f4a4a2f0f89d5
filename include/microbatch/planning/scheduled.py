"""Pure planning of the scheduled batches: ledger positions + broker offsets + policy -> the offset ranges of the next
batch (where each partition starts, the data-loss policy, budgets and limits, Spark's splits), the further batches of
one run, and which open batches a run reuses (`plan_run`).

No I/O here. Every function is deterministic in its arguments, so a replay of a plan
reads the same ranges, and the logic is unit-tested on its own (like Hudi's
`KafkaOffsetGen.computeOffsetRanges`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from microbatch.config import OffsetReset, OnDataLoss, SourceSpec, Startup
from microbatch.errors import DataLossError, SpecError
from microbatch.planning.data_loss import data_loss_at_read, lost_ranges
from microbatch.types import Gap, OffsetRange, OpenBatch, Plan, PlanningLedger, StartupOffsets, TopicPartition


def check_specific_offsets(source: SourceSpec, discovered: Iterable[TopicPartition]) -> None:
    """Refuse a `specific_offsets` entry for a partition the source does not have (SpecError)."""
    if source.startup.mode is not Startup.SPECIFIC_OFFSETS:
        return
    known = {(tp.topic, tp.partition) for tp in discovered}
    for topic, partition in sorted(source.startup.specific_offsets):
        if (topic, partition) not in known:
            have = sorted(p for t, p in known if t == topic)
            where = f"topic '{topic}' has partitions {have[0]}..{have[-1]}" if have else f"the source has no '{topic}'"
            raise SpecError(
                f"source.startup.offsets names partition {topic}:{partition}, but {where}.",
                fix="Remove the entry or fix the topic or partition number in the pipeline spec.",
            )


def startup_offset(
    tp: TopicPartition, low: int, high: int, source: SourceSpec, looked_up: StartupOffsets
) -> tuple[int, str]:
    """The first offset of a partition the ledger has never seen, by `source.startup`, and how it was chosen.

    An offset outside [earliest, latest] is refused with a SpecError rather than silently moved.
    """
    startup = source.startup
    mode = startup.mode
    if mode is Startup.EARLIEST:
        return low, "earliest"
    if mode is Startup.LATEST:
        return high, "latest"
    if mode is Startup.TIMESTAMP:
        found = looked_up.for_time.get(tp)
        if found is None:
            return high, f"latest (no record at or after timestamp {startup.timestamp})"
        return min(found, high), f"timestamp {startup.timestamp}"
    offset: int | None = None
    how = ""
    if mode is Startup.SPECIFIC_OFFSETS:
        offset = startup.specific_offsets.get((tp.topic, tp.partition))
        how = "specific offset"
    if offset is None:
        offset = looked_up.committed.get(tp)
        how = "group offset"
    if offset is None:
        offset = low if startup.reset is OffsetReset.EARLIEST else high
        return offset, f"{startup.reset.value} (no committed group offset)"
    if not low <= offset <= high:
        raise SpecError(
            f"{tp}: the startup {how} {offset} lies outside the partition's offsets [{low}, {high}].",
            fix="Choose an offset inside that range, or another source.startup mode.",
        )
    return offset, f"{how} {offset}"


def resolve_starts(
    positions: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    source: SourceSpec,
    looked_up: StartupOffsets | None = None,
) -> tuple[dict[TopicPartition, int], list[TopicPartition], list[Gap], dict[TopicPartition, str]]:
    """Decide where each discovered partition starts.

    A partition the ledger knows starts at its position. On the pipeline's first plan, the
    partitions start by the startup mode; a partition found later starts at earliest. A position
    below the earliest offset is data loss: it fails the plan under `on_data_loss: fail`, and
    becomes a recorded gap under `skip`. Never a silent reset.
    """
    looked_up = looked_up or StartupOffsets()
    # As in Flink, the startup mode applies to the partitions of the first plan; any partition or
    # topic found after that was created after the pipeline started, so it is read from its first record.
    first_plan = not positions
    starts: dict[TopicPartition, int] = {}
    new: list[TopicPartition] = []
    gaps: list[Gap] = []
    how: dict[TopicPartition, str] = {}
    for tp in sorted(latest):
        low, high = earliest[tp], latest[tp]
        if tp not in positions:
            new.append(tp)
            if first_plan:
                starts[tp], how[tp] = startup_offset(tp, low, high, source, looked_up)
            else:
                starts[tp], how[tp] = low, "earliest: found after the pipeline started"
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
    return starts, new, gaps, how


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
    max_records_per_partition: int | None = None,
) -> tuple[list[OffsetRange], dict[TopicPartition, int]]:
    """The non-empty ranges of the next batch, and the backlog per partition before it.

    Each partition is first capped at `max_records_per_partition`, then the batch limit is
    shared in proportion to the capped backlogs.
    """
    backlog = {tp: max(0, latest[tp] - start) for tp, start in starts.items()}
    capped = backlog if max_records_per_partition is None else {
        tp: min(size, max_records_per_partition) for tp, size in backlog.items()
    }
    budget = split_budget(capped, max_records_per_batch)
    ranges = [
        OffsetRange(tp.topic, tp.partition, starts[tp], starts[tp] + budget[tp])
        for tp in sorted(starts)
        if budget[tp] > 0
    ]
    return ranges, backlog


def defer_reason(available: int, source: SourceSpec, waited_seconds: float | None) -> str | None:
    """Why a batch of `available` records should wait for more (`min_records_per_batch`), or None to run it.

    Like Spark's `minOffsetsPerTrigger` with `maxTriggerDelay`: a small batch waits, but never
    longer than the wait limit since the last batch.
    """
    minimum = source.min_records_per_batch
    if minimum is None or available == 0 or available >= minimum:
        return None
    waited = waited_seconds or 0.0
    limit = source.wait_limit_seconds
    if waited >= limit:
        return None
    return (f"only {available} new record(s), below min_records_per_batch {minimum}; "
            f"waiting up to {limit:.0f}s since the last batch ({waited:.0f}s so far)")


def spark_splits(ranges: Iterable[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """The pieces Spark's Kafka source reads a batch in under `minPartitions` (one Spark task each).

    A pure mirror of Spark's `KafkaOffsetRangeCalculator` (and Hudi's `computeOffsetRanges`):
    when there are fewer ranges than `min_partitions`, large ranges are cut into parts in
    proportion to their size (rounded half up, at least one), and each range is cut into
    near-equal consecutive parts. It depends only on the ranges, so a replay reads the same splits.
    The ledger keeps one range per partition; the splits exist only inside the Spark read.
    """
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges

    def part_count(size: int, total: int, parts: int) -> int:
        return max(math.floor(size / total * parts + 0.5), 1)

    total = sum(r.size for r in ranges)
    unsplit = [r for r in ranges if part_count(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    pieces: list[OffsetRange] = []
    for r in ranges:
        parts = 1 if r in unsplit else part_count(r.size, split_total, split_min)
        remaining, start = r.size, r.start
        for part in range(parts):
            size = remaining // (parts - part)  # the last part takes the rounding
            remaining -= size
            end = min(start + size, r.end)
            if end > start:
                pieces.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return pieces


def disappeared_topics(positions: Mapping[TopicPartition, int], discovered: Iterable[TopicPartition]) -> list[str]:
    """Topics the ledger has positions for that discovery no longer finds (deleted or no longer matching)."""
    seen = {tp.topic for tp in discovered}
    return sorted({tp.topic for tp in positions} - seen)


def plan_batch(
    positions: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    source: SourceSpec,
    looked_up: StartupOffsets | None = None,
    waited_seconds: float | None = None,
) -> Plan:
    """Everything `plan` decides, from what it read: starts, data-loss policy, limits and ranges.

    `looked_up` carries the broker's answers for the startup modes; `waited_seconds` is the
    time since the last batch, for `min_records_per_batch`.
    """
    check_specific_offsets(source, latest)
    starts, new, gaps, how = resolve_starts(positions, earliest, latest, source, looked_up)
    ranges, backlog = plan_ranges(starts, latest, source.max_records_per_batch, source.max_records_per_partition)
    deferred = None
    if not gaps:
        deferred = defer_reason(sum(backlog.values()), source, waited_seconds)
        if deferred:
            ranges = []
    return Plan(
        ranges=tuple(ranges),
        new_partitions=tuple(new),
        gaps=tuple(gaps),
        backlog=backlog,
        starts=starts,
        startup=how,
        disappeared_topics=tuple(disappeared_topics(positions, latest)),
        deferred=deferred,
    )


def follow_on_plans(first: Plan, latest: Mapping[TopicPartition, int], source: SourceSpec) -> list[Plan]:
    """The further batches of one run under `source.max_batches_per_run`, after `first`.

    Each starts where the one before ends on every partition and is limited like any batch (the batch and
    partition limits, split by backlog), as Structured Streaming's `Trigger.AvailableNow` splits a backlog
    under `maxOffsetsPerTrigger`. The chain stops at the run's limit, when the backlog is read, or when the
    rest is below `min_records_per_batch` (it waits for a later run, as any small batch does). Only the
    first plan can hold new partitions or gaps: the ones after it start at positions it set.
    """
    plans: list[Plan] = []
    previous = first
    starts = dict(first.starts)
    while len(plans) + 1 < source.max_batches_per_run and previous.ranges and not previous.deferred:
        starts.update({r.tp: r.end for r in previous.ranges})
        ranges, backlog = plan_ranges(starts, latest, source.max_records_per_batch, source.max_records_per_partition)
        if not ranges or defer_reason(sum(backlog.values()), source, 0.0):
            break
        previous = Plan(ranges=tuple(ranges), backlog=backlog, starts=dict(starts))
        plans.append(previous)
    return plans


@dataclass
class RunPlan:
    """What one plan does: the open batches it runs again, or the new plans (the first one and its follow-ons) it
    inserts; and, under `on_data_loss: skip`, the open batch from which retention ran ahead (it and every open batch
    after it are abandoned)."""

    reused: list[OpenBatch]
    plan: Plan | None
    plans: list[Plan]
    abandon_from: tuple[int, str] | None = None
    """(batch id, why) of the first open batch to abandon."""


def plan_run(ledger: PlanningLedger, earliest: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
             source: SourceSpec, looked_up: StartupOffsets) -> RunPlan:
    """Reuse the open batches, oldest first, or plan new ones (`plan_batch`, `follow_on_plans`).

    If retention deleted part of a planned open batch, under `fail` that raises (DataLossError); under `skip` that
    batch and every open batch after it (each starts where the one before ends) are to be abandoned, the batches
    before it are still reused, and when none is, the fresh plan records the gap."""
    reused: list[OpenBatch] = []
    abandon_from = None
    for batch in ledger.open_batches:
        lost = lost_ranges(batch.ranges, earliest) if batch.planned else []
        if lost:
            error = data_loss_at_read(batch.batch_id, lost, source.on_data_loss)
            if source.on_data_loss is OnDataLoss.FAIL:
                raise error
            abandon_from = (batch.batch_id, error.message)
            break
        reused.append(batch)
    if reused:
        return RunPlan(reused, None, [], abandon_from)
    plan = plan_batch(ledger.positions, earliest, latest, source, looked_up, ledger.waited_seconds)
    plans = [plan, *follow_on_plans(plan, latest, source)] if plan.ranges or plan.gaps else []
    return RunPlan([], plan, plans, abandon_from)
