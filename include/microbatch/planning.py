"""Pure planning: ledger positions + broker offsets + policy -> the offset ranges of one batch.

No I/O here. Every function is deterministic in its arguments, so a replay of a plan
reads the same ranges, and the logic is unit-tested on its own (like Hudi's
`KafkaOffsetGen.computeOffsetRanges`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from microbatch.config import OffsetReset, OnDataLoss, SourceSpec, Startup
from microbatch.errors import DataLossError, SpecError
from microbatch.types import (
    BackfillBatch,
    BackfillLedger,
    CommittedRange,
    Gap,
    OffsetRange,
    OpenBatch,
    Plan,
    PlanningLedger,
    StartupOffsets,
    TopicPartition,
)


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


def lost_ranges(ranges: Iterable[OffsetRange], earliest: Mapping[TopicPartition, int]) -> list[OffsetRange]:
    """The parts of planned ranges that retention has deleted since they were planned (start below earliest)."""
    return [
        OffsetRange(r.topic, r.partition, r.start, min(r.end, earliest[r.tp]))
        for r in sorted(ranges)
        if r.tp in earliest and r.start < earliest[r.tp]
    ]


def data_loss_at_read(batch_id: int, lost: list[OffsetRange], on_data_loss: OnDataLoss) -> DataLossError:
    """The one-sentence error for offsets of an open batch that were deleted between plan and stage."""
    names = ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in lost)
    how = (
        "The next plan abandons this batch and records the lost offsets as a gap (on_data_loss: skip)."
        if on_data_loss is OnDataLoss.SKIP
        else "Restore the offsets, or set source.on_data_loss: skip so the next plan abandons this batch "
        "and records them as a gap."
    )
    return DataLossError(
        f"Batch {batch_id}: offsets {names} were deleted by retention after the batch was planned and before "
        "they were read.",
        fix=how,
    )


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


# Backfill sub-ranges: what a fill processes and what a replay replaces.

def subtract(request: OffsetRange, covered: list[OffsetRange]) -> list[OffsetRange]:
    """The parts of `request` that no range in `covered` (same partition) contains."""
    holes = []
    cursor = request.start
    for r in sorted(c for c in covered if c.tp == request.tp and c.end > request.start and c.start < request.end):
        if r.start > cursor:
            holes.append(OffsetRange(request.topic, request.partition, cursor, r.start))
        cursor = max(cursor, r.end)
    if cursor < request.end:
        holes.append(OffsetRange(request.topic, request.partition, cursor, request.end))
    return holes


@dataclass
class FillPlan:
    """What a `fill` backfill will do, before anything runs."""

    todo: list[OffsetRange] = field(default_factory=list)
    already_committed: list[OffsetRange] = field(default_factory=list)
    ahead_of_position: list[OffsetRange] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(r.size for r in self.todo)


def plan_fill(
    requests: list[OffsetRange], committed: list[OffsetRange], positions: Mapping[TopicPartition, int]
) -> FillPlan:
    """Split each requested range into: never-committed holes below the scheduled position (to do),
    already-committed parts (reported and skipped), and parts at or after the position (left to
    the scheduled runs)."""
    plan = FillPlan()
    for request in requests:
        for r in committed:
            if r.tp == request.tp and r.end > request.start and r.start < request.end:
                plan.already_committed.append(
                    OffsetRange(r.topic, r.partition, max(r.start, request.start), min(r.end, request.end)))
        position = positions.get(request.tp, 0)
        for hole in subtract(request, committed):
            if hole.start < position:
                plan.todo.append(OffsetRange(hole.topic, hole.partition, hole.start, min(hole.end, position)))
            if hole.end > position:
                plan.ahead_of_position.append(
                    OffsetRange(hole.topic, hole.partition, max(hole.start, position), hole.end))
    return plan


@dataclass
class ReplayPlan:
    """What a `replay` backfill will do, before anything runs."""

    replace: list[CommittedRange] = field(default_factory=list)
    never_committed: list[OffsetRange] = field(default_factory=list)
    widened: list[tuple[OffsetRange, OffsetRange]] = field(default_factory=list)
    """(requested, replayed) for each partition whose request was widened to whole committed ranges."""
    whole_batches: list[CommittedRange] = field(default_factory=list)
    """The ranges of other partitions added so that each batch is replayed whole (a sink with contributions
    per batch)."""

    @property
    def records(self) -> int:
        return sum(c.range.size for c in self.replace)

    def by_batch(self) -> dict[int, list[CommittedRange]]:
        """The replaced ranges grouped by the batch that committed them: one replay batch each."""
        groups: dict[int, list[CommittedRange]] = {}
        for c in sorted(self.replace, key=lambda c: (c.batch_id, c.range)):
            groups.setdefault(c.batch_id, []).append(c)
        return groups


def plan_replay(requests: list[OffsetRange], committed: list[CommittedRange], *,
                whole_batches: bool = False) -> ReplayPlan:
    """Every committed range that overlaps a request is replayed whole; parts of a request that no
    committed range covers are reported (a replay of them is refused: use `fill`). With `whole_batches` (a sink
    keeps one contribution per batch), so is every other committed range of the batches those ranges belong
    to."""
    plan = ReplayPlan()
    for request in requests:
        hits = sorted((c for c in committed if c.range.tp == request.tp and c.range.end > request.start
                       and c.range.start < request.end), key=lambda c: c.range)
        plan.never_committed.extend(subtract(request, [c.range for c in hits]))
        plan.replace.extend(hits)
        if hits:
            low, high = hits[0].range.start, max(c.range.end for c in hits)
            if low < request.start or high > request.end:
                plan.widened.append((request, OffsetRange(request.topic, request.partition, low, high)))
    if whole_batches:
        touched = {c.batch_id for c in plan.replace}
        chosen = {c.range_id for c in plan.replace}
        plan.whole_batches = sorted((c for c in committed if c.batch_id in touched and c.range_id not in chosen),
                                    key=lambda c: (c.batch_id, c.range))
        plan.replace.extend(plan.whole_batches)
    return plan


def open_overlaps(
    ranges: list[OffsetRange], open_ranges: list[tuple[int, str, OffsetRange]]
) -> list[tuple[OffsetRange, int, str]]:
    """(range, open batch id, its state) for each range that overlaps a batch still open."""
    return [(r, batch_id, state) for r in ranges for batch_id, state, o in open_ranges
            if o.tp == r.tp and o.end > r.start and o.start < r.end]


def layers(ranges: list[OffsetRange]) -> list[list[OffsetRange]]:
    """Group ranges so each group has at most one range per partition (one backfill batch each)."""
    groups: list[list[OffsetRange]] = []
    for r in sorted(ranges):
        for group in groups:
            if all(g.tp != r.tp for g in group):
                group.append(r)
                break
        else:
            groups.append([r])
    return groups


@dataclass
class BackfillPlan:
    """What a backfill will do: its fill or replay plan, and the batches to insert (one per layer or per replayed
    batch)."""

    fill: FillPlan
    replay: ReplayPlan | None
    batches: list[BackfillBatch]


def plan_backfill_batches(pipeline: str, mode: str, requests: list[OffsetRange], ledger: BackfillLedger, *,
                          whole_batches: bool) -> BackfillPlan:
    """Plan a `fill` or a `replay` of `requests` over what the ledger holds. Refused (SpecError, before anything is
    written) when a replayed range was never committed, a range overlaps a batch still open, or a replayed batch
    kept no per-partition contributions."""
    if mode != "replay":
        fill = plan_fill(requests, ledger.committed, ledger.positions)
        refuse_open_overlaps(pipeline, fill.todo, ledger.open_ranges)
        return BackfillPlan(fill, None, [BackfillBatch(tuple(group)) for group in layers(fill.todo)])
    replay = plan_replay(requests, ledger.committed_rows, whole_batches=whole_batches)
    if replay.never_committed:
        first = replay.never_committed[0]
        raise SpecError(
            f"Backfill mode 'replay': {first} was never committed, so there is nothing to replay"
            f"{f' (and {len(replay.never_committed) - 1} more range(s))' if len(replay.never_committed) > 1 else ''}.",
            fix="Narrow the range to committed offsets (`microbatch history`), or use mode 'fill' for these.",
        )
    refuse_open_overlaps(pipeline, [c.range for c in replay.replace], ledger.open_ranges)
    groups = replay.by_batch()
    missing = [batch_id for batch_id in ledger.without_contributions if batch_id in groups]
    if missing:
        raise SpecError(
            f"Backfill mode 'replay': batch {missing[0]} was committed before per-partition contributions were "
            "kept (migration 0005), so its output cannot be retracted.",
            fix="Replay only ranges committed since that upgrade (`microbatch history`).",
        )
    batches = [BackfillBatch(tuple(c.range for c in replaced), original_id, tuple(c.range_id for c in replaced))
               for original_id, replaced in groups.items()]
    return BackfillPlan(FillPlan(), replay, batches)


def refuse_open_overlaps(
    pipeline: str, ranges: list[OffsetRange], open_ranges: list[tuple[int, str, OffsetRange]]
) -> None:
    """Refuse (SpecError) a backfill range that overlaps a batch still open."""
    clash = open_overlaps(ranges, open_ranges)
    if clash:
        r, batch_id, state = clash[0]
        raise SpecError(
            f"Backfill range {r} overlaps batch {batch_id}, which is still {state}; nothing was written.",
            fix=f"Retry when batch {batch_id} has ended; if the run that owns it is gone, close it with "
            f"`microbatch abandon {pipeline} {batch_id}`.",
        )
