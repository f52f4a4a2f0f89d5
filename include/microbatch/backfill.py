"""Backfills by offset range or time range, mode `fill`: a ledger entry of their own.

A backfill never moves the scheduled cursor. `fill` processes only the sub-ranges of the request
that no committed batch covers and that lie below the scheduled position (offsets at or after
it are left to the scheduled runs, so the two never collide). Overlap is checked again inside
the commit transaction and enforced by the exclusion constraint.

The pure part (`BackfillParams`, `subtract`, `plan_fill`) does no I/O; `plan_backfill` reads the
ledger and the broker and inserts the batch.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from microbatch.config import PipelineSpec
from microbatch.errors import SpecError
from microbatch.planning import OffsetRange, Plan, TopicPartition

log = logging.getLogger(__name__)


class BackfillParams(BaseModel):
    """The trigger form of `<pipeline>__backfill` (Airflow Params, the CLI and the REST API)."""

    model_config = ConfigDict(extra="forbid")

    topic: str
    partitions: list[int] | Literal["all"] = "all"
    start: int | datetime
    """First offset, or a time resolved with offsets-for-times (the first offset at or after it)."""
    end: int | datetime
    """End offset (exclusive), or a time resolved the same way."""
    mode: Literal["fill", "replay"] = "fill"
    dry_run: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> BackfillParams:
        if isinstance(self.start, datetime) != isinstance(self.end, datetime):
            raise ValueError("start and end must both be offsets or both be times")
        if isinstance(self.start, int) and (self.start < 0 or self.end <= self.start):  # type: ignore[operator]
            raise ValueError("end must be greater than start, and start at least 0")
        if isinstance(self.start, datetime) and self.end <= self.start:  # type: ignore[operator]
            raise ValueError("end must be after start")
        if self.mode == "replay":
            raise ValueError("mode 'replay' is not available yet; use 'fill'")
        return self


def parse_params(spec: PipelineSpec, raw: Mapping[str, object]) -> BackfillParams:
    """Validate backfill parameters; the error names the field and says what to change."""
    values = {k: v for k, v in raw.items() if v not in (None, "")}
    for key in ("start", "end"):
        if isinstance(values.get(key), str) and str(values[key]).lstrip("-").isdigit():
            values[key] = int(str(values[key]))
    try:
        params = BackfillParams.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "parameters"
        raise SpecError(f"Backfill parameter '{where}': {first['msg'].removeprefix('Value error, ')}.") from None
    pattern = spec.source.topic_pattern
    if not (params.topic in spec.source.topics or (pattern and re.fullmatch(pattern, params.topic))):
        raise SpecError(
            f"Backfill parameter 'topic': '{params.topic}' is not a topic of pipeline {spec.name}.",
            fix=f"Use one of: {', '.join(spec.source.topics)}." if spec.source.topics
            else f"Use a topic matching {pattern}.",
        )
    return params


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
class BackfillOutcome:
    params: BackfillParams
    requests: list[OffsetRange]
    plan: FillPlan
    batch_ids: list[int]


def plan_backfill(
    spec: PipelineSpec,
    raw_params: Mapping[str, object],
    ledger_url: str,
    bootstrap_servers: str,
    airflow_run_id: str | None = None,
) -> BackfillOutcome:
    """Validate, resolve times, plan the fill, and (unless dry run) insert one backfill batch per layer."""
    from kafka import TopicPartition as KafkaTopicPartition

    from microbatch.kafka_offsets import discover_partitions, offset_bounds, offsets_client
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction
    from microbatch.ledger.models import BatchKind

    params = parse_params(spec, raw_params)
    with offsets_client(bootstrap_servers, spec.source.isolation_level) as consumer:
        known = [tp for tp in discover_partitions(consumer, [params.topic])]
        wanted = known if params.partitions == "all" else [TopicPartition(params.topic, p) for p in params.partitions]
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            raise SpecError(
                f"Backfill parameter 'partitions': {', '.join(str(tp) for tp in unknown)} does not exist.",
                fix=f"{params.topic} has partitions 0..{len(known) - 1}.",
            )
        earliest, latest = offset_bounds(consumer, wanted)
        bounds: dict[TopicPartition, tuple[int, int]] = {}
        for tp in wanted:
            if isinstance(params.start, datetime):
                ktp = KafkaTopicPartition(tp.topic, tp.partition)
                first = consumer.offsets_for_times({ktp: _epoch_ms(params.start)})[ktp]
                last = consumer.offsets_for_times({ktp: _epoch_ms(params.end)})[ktp]  # type: ignore[arg-type]
                start = first.offset if first else latest[tp]
                end = last.offset if last else latest[tp]
            else:
                start, end = int(params.start), int(params.end)  # type: ignore[arg-type]
            end = min(end, latest[tp])  # "up to offset N" on a shorter partition means up to its end
            if start < earliest[tp] and start < end:
                raise SpecError(
                    f"Backfill range {tp} [{start}, {end}) starts before the earliest offset Kafka still holds "
                    f"({earliest[tp]}): those records were deleted by retention.",
                    fix=f"Start at {earliest[tp]} or later.",
                )
            bounds[tp] = (start, end)
    requests = [OffsetRange(tp.topic, tp.partition, s, e) for tp, (s, e) in sorted(bounds.items()) if e > s]
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        committed = repo.committed_ranges(session, pipeline.id)
        positions = repo.read_positions(session, pipeline.id)
        fill = plan_fill(requests, committed, positions)
        batch_ids: list[int] = []
        if not params.dry_run:
            for group in layers(fill.todo):
                batch = repo.insert_batch(session, pipeline, Plan(ranges=tuple(group)), kind=BatchKind.BACKFILL,
                                          airflow_run_id=airflow_run_id)
                batch.state_before = {}  # history: no watermark, so nothing in it is late
                batch_ids.append(batch.id)
    return BackfillOutcome(params, requests, fill, batch_ids)


def _epoch_ms(value: datetime) -> int:
    """Kafka timestamps are epoch milliseconds; a time without a zone is taken as UTC."""
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)
