"""Pure planning of a backfill: the sub-ranges a `fill` processes (never-committed holes below the position) and the
committed ranges a `replay` replaces, grouped into the batches to insert; refused before anything is written when a
range overlaps a batch still open.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from microbatch.errors import SpecError
from microbatch.types import BackfillBatch, BackfillLedger, CommittedRange, OffsetRange, TopicPartition


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
