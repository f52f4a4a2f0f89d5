"""Backfills by offset range or time range: a ledger entry of their own, in two modes.

A backfill never moves the scheduled cursor.
- `fill` processes only the sub-ranges of the request that no committed batch covers and that lie
  below the scheduled position (offsets at or after it are left to the scheduled runs, so the two
  never collide).
- `replay` recomputes ranges that were already committed and replaces their contribution. The
  request is widened to whole committed ranges (a (batch, partition) contribution is the unit a
  sink keeps); one replay batch per original batch, started from that batch's state, so a replay
  with an unchanged job reproduces the original exactly.

Overlap is checked again inside the commit transaction and enforced by the exclusion constraint.
A request that overlaps a batch still open is refused until that batch ends.

The sub-range planning itself (`plan_fill`, `plan_replay`) is pure and lives in `planning.py`; here are
the parameters (`BackfillParams`, `parse_params`) and `plan_backfill`, which resolves the request on the
broker, reads the ledger and inserts the batches.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from kafka import KafkaConsumer
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.errors import SpecError, first_validation_error
from microbatch.kafka.offsets import discover_partitions, offset_bounds, offsets_client, offsets_for_time
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger
from microbatch.ledger.models import BatchKind, Pipeline
from microbatch.phases.plan import check_pipeline
from microbatch.planning import FillPlan, ReplayPlan, layers, open_overlaps, plan_fill, plan_replay
from microbatch.settings import KafkaSettings
from microbatch.sinks.registry import sinks_of
from microbatch.types import CommittedRange, OffsetRange, Plan, TopicPartition

log = logging.getLogger(__name__)
TimeOffsets = dict[TopicPartition, int | None]


class BackfillParams(BaseModel):
    """The trigger form of `<pipeline>__backfill` (Airflow Params, the CLI and the REST API)."""

    model_config = ConfigDict(extra="forbid")

    topic: str
    partitions: list[int] | Literal["all"] = "all"
    start: int | datetime
    """First offset, or a time resolved with offsets-for-times (the first offset at or after it)."""
    end: int | datetime | Literal["latest"]
    """End offset (exclusive), a time resolved the same way, or `latest` (each partition's end)."""
    mode: Literal["fill", "replay"] = "fill"
    dry_run: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> BackfillParams:
        # Messages start with the field they are about: parse_params names it.
        if isinstance(self.start, int) and self.start < 0:
            raise ValueError("start: an offset is at least 0")
        if self.end == "latest":
            return self
        if isinstance(self.start, datetime) != isinstance(self.end, datetime):
            raise ValueError("end: start and end must both be offsets or both be times")
        if self.end <= self.start:  # type: ignore[operator]
            raise ValueError("end: must be greater than start")
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
        where, message = first_validation_error(exc)
        raise SpecError(f"Backfill parameter '{where}': {message}.") from None
    pattern = spec.source.topic_pattern
    if not (params.topic in spec.source.topics or (pattern and re.fullmatch(pattern, params.topic))):
        raise SpecError(
            f"Backfill parameter 'topic': '{params.topic}' is not a topic of pipeline {spec.name}.",
            fix=f"Use one of: {', '.join(spec.source.topics)}." if spec.source.topics
            else f"Use a topic matching {pattern}.",
        )
    return params


@dataclass
class BackfillOutcome:
    params: BackfillParams
    requests: list[OffsetRange]
    plan: FillPlan
    batch_ids: list[int]
    replay: ReplayPlan | None = None
    affected_rows: dict[str, tuple[int, object, object]] = field(default_factory=dict)
    """Replay: sink -> (rows whose contribution is replaced, first window start, last window end)."""


def plan_backfill(
    spec: PipelineSpec,
    raw_params: Mapping[str, object],
    ledger: Ledger,
    kafka: KafkaSettings,
    airflow_run_id: str | None = None,
) -> BackfillOutcome:
    """Validate, resolve times, plan the fill, and (unless dry run) insert one backfill batch per layer."""
    params = parse_params(spec, raw_params)
    check_pipeline(spec, ledger)  # the sink tables and the transform, before any batch is opened
    requests = _requested_ranges(params, spec.source.isolation_level, kafka)
    with ledger.transaction() as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        if params.mode == "replay":
            return _plan_replay(session, spec, pipeline, params, requests, airflow_run_id)
        return _plan_fill(session, spec, pipeline, params, requests, airflow_run_id)


def _requested_ranges(params: BackfillParams, isolation_level: str, kafka: KafkaSettings) -> list[OffsetRange]:
    """The request as one offset range per partition, times resolved on the broker. Refused (SpecError) for a
    partition that does not exist, an end beyond the latest offset, a start before the earliest offset Kafka
    still holds, or a start time after every record of the topic."""
    with offsets_client(kafka, isolation_level) as consumer:
        wanted = _wanted_partitions(consumer, params)
        earliest, latest = offset_bounds(consumer, wanted)
        starts, ends = _resolve_times(consumer, params, wanted)
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    for tp in wanted:
        start, end = _partition_bounds(params, tp, latest[tp], starts, ends)
        if start < earliest[tp] and start < end:
            raise SpecError(
                f"Backfill range {tp} [{start}, {end}) starts before the earliest offset Kafka still holds "
                f"({earliest[tp]}): those records were deleted by retention.",
                fix=f"Start at {earliest[tp]} or later.",
            )
        bounds[tp] = (start, end)
    if starts is not None and wanted and all(starts[tp] is None for tp in wanted):
        raise SpecError(
            f"Backfill parameter 'start': no record of {params.topic} has a timestamp at or after "
            f"{params.start}, so the time resolves to no offset.",
            fix="Pick an earlier start time, or give offsets.",
        )
    return [OffsetRange(tp.topic, tp.partition, s, e) for tp, (s, e) in sorted(bounds.items()) if e > s]


def _wanted_partitions(consumer: KafkaConsumer, params: BackfillParams) -> list[TopicPartition]:
    known = discover_partitions(consumer, [params.topic])
    wanted = known if params.partitions == "all" else [TopicPartition(params.topic, p) for p in params.partitions]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise SpecError(
            f"Backfill parameter 'partitions': {', '.join(str(tp) for tp in unknown)} does not exist.",
            fix=f"{params.topic} has partitions 0..{len(known) - 1}.",
        )
    return wanted


def _resolve_times(
    consumer: KafkaConsumer, params: BackfillParams, wanted: list[TopicPartition]
) -> tuple[TimeOffsets | None, TimeOffsets | None]:
    """The offsets of a time range's start and end (None for an offset range, and for end 'latest')."""
    if not isinstance(params.start, datetime):
        return None, None
    starts = offsets_for_time(consumer, wanted, _epoch_ms(params.start))
    if params.end == "latest":
        return starts, None
    return starts, offsets_for_time(consumer, wanted, _epoch_ms(params.end))  # type: ignore[arg-type]


def _partition_bounds(
    params: BackfillParams, tp: TopicPartition, latest: int, starts: TimeOffsets | None, ends: TimeOffsets | None
) -> tuple[int, int]:
    """[start, end) of one partition; a time with no record at or after it resolves to the latest offset."""
    if starts is not None:
        start = starts[tp]
        end = None if ends is None else ends[tp]
        return (latest if start is None else start), (latest if end is None else end)
    start = int(params.start)  # type: ignore[arg-type]
    end = latest if params.end == "latest" else int(params.end)  # type: ignore[arg-type]
    if end > latest:
        raise SpecError(
            f"Backfill parameter 'end': {end} is beyond the latest offset of {tp} ({latest}).",
            fix="Use an end at or below it, or end 'latest' to go up to each partition's end.",
        )
    return start, end


def _plan_fill(session: Session, spec: PipelineSpec, pipeline: Pipeline, params: BackfillParams,
               requests: list[OffsetRange], airflow_run_id: str | None) -> BackfillOutcome:
    positions = repo.read_positions(session, pipeline.id)
    fill = plan_fill(requests, repo.committed_ranges(session, pipeline.id), positions)
    _refuse_open_overlaps(spec.name, fill.todo, repo.open_ranges(session, pipeline.id))
    batch_ids: list[int] = []
    if not params.dry_run:
        for group in layers(fill.todo):
            batch = repo.insert_batch(session, pipeline, Plan(ranges=tuple(group)), kind=BatchKind.BACKFILL,
                                      airflow_run_id=airflow_run_id)
            batch.state_before = {}  # history: no watermark, so nothing in it is late
            batch_ids.append(batch.id)
    return BackfillOutcome(params, requests, fill, batch_ids)


def _refuse_open_overlaps(
    pipeline: str, ranges: list[OffsetRange], open_ranges: list[tuple[int, str, OffsetRange]]
) -> None:
    clash = open_overlaps(ranges, open_ranges)
    if clash:
        r, batch_id, state = clash[0]
        raise SpecError(
            f"Backfill range {r} overlaps batch {batch_id}, which is still {state}; nothing was written.",
            fix=f"Retry when batch {batch_id} has ended; if the run that owns it is gone, close it with "
            f"`microbatch abandon {pipeline} {batch_id}`.",
        )


def _plan_replay(session: Session, spec: PipelineSpec, pipeline: Pipeline, params: BackfillParams,
                 requests: list[OffsetRange], airflow_run_id: str | None) -> BackfillOutcome:
    for sink in sinks_of(spec).values():
        sink.check_replay()
    whole_batches = any(sink.replays_whole_batches for sink in sinks_of(spec).values())
    replay = plan_replay(requests, repo.committed_range_rows(session, pipeline.id), whole_batches=whole_batches)
    if replay.never_committed:
        first = replay.never_committed[0]
        raise SpecError(
            f"Backfill mode 'replay': {first} was never committed, so there is nothing to replay"
            f"{f' (and {len(replay.never_committed) - 1} more range(s))' if len(replay.never_committed) > 1 else ''}.",
            fix="Narrow the range to committed offsets (`microbatch history`), or use mode 'fill' for these.",
        )
    _refuse_open_overlaps(spec.name, [c.range for c in replay.replace], repo.open_ranges(session, pipeline.id))
    groups = replay.by_batch()
    missing = repo.batches_without_contributions(session, list(groups))
    if missing:
        raise SpecError(
            f"Backfill mode 'replay': batch {missing[0]} was committed before per-partition contributions were "
            "kept (migration 0005), so its output cannot be retracted.",
            fix="Replay only ranges committed since that upgrade (`microbatch history`).",
        )
    affected = _affected_rows(session, spec, replay.replace)
    batch_ids: list[int] = []
    if not params.dry_run:
        for original_id, replaced in groups.items():
            original = repo.get_batch(session, original_id)
            batch = repo.insert_batch(session, pipeline, Plan(ranges=tuple(c.range for c in replaced)),
                                      kind=BatchKind.REPLAY, airflow_run_id=airflow_run_id)
            batch.state_before = dict(original.state_before or {})  # replay from the original's state
            batch.replaces = [c.range_id for c in replaced]
            batch_ids.append(batch.id)
    return BackfillOutcome(params, requests, FillPlan(), batch_ids, replay=replay, affected_rows=affected)


def _affected_rows(
    session: Session, spec: PipelineSpec, replace: list[CommittedRange]
) -> dict[str, tuple[int, object, object]]:
    """Per sink that reports it (an aggregate): the rows whose contribution a replay replaces, and the windows they
    span."""
    affected: dict[str, tuple[int, object, object]] = {}
    keys = [{"b": c.batch_id, "t": c.range.topic, "n": c.range.partition} for c in replace]
    if not keys:
        return affected
    for sink in sinks_of(spec).values():
        footprint = sink.replay_footprint(session, json.dumps(keys))
        if footprint is not None:
            affected[sink.name] = footprint
    return affected


def _epoch_ms(value: datetime) -> int:
    """Kafka timestamps are epoch milliseconds; a time without a zone is taken as UTC."""
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)
