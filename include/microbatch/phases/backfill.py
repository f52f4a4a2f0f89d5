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

The sub-range planning itself (`plan_backfill_batches`: `plan_fill`, `plan_replay`) is pure and lives in
`planning/backfill.py`, the request's lookups on the broker in `kafka/offsets.py` (`requested_ranges`); here are the
parameters (`BackfillParams`, `parse_params`) and `plan_backfill`, which calls each of them once, then inserts
the batches.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from microbatch.config import PipelineSpec
from microbatch.errors import SpecError, first_validation_error
from microbatch.formats.schema_registry import Registry
from microbatch.kafka.offsets import requested_ranges
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger
from microbatch.ledger.models import BatchKind
from microbatch.phases.pins import configured_registry, plan_pins
from microbatch.phases.plan import check_pipeline
from microbatch.planning import FillPlan, ReplayPlan, plan_backfill_batches
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange

log = logging.getLogger(__name__)


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


PARTITIONS_PATTERN = r"^\s*(all|\d+(\s*,\s*\d+)*)\s*$"
"""The trigger form's `partitions`: `all`, or partition numbers separated by commas (`0, 2`)."""


def form_params(topic: str, start: str, end: str, partitions: str, mode: str, dry_run: bool) -> dict[str, object]:
    """The trigger form's values (`airflow/dags.py`) for a backfill given as text (the CLI): an offset as `start` or
    `end` (a number, so the form's number fields take it), a time as `start_time` or `end_time`, `latest` as no
    `end`; `parse_params` reads them back."""
    values: dict[str, object] = {"topic": topic, "partitions": partitions, "mode": mode, "dry_run": dry_run}
    for key, given in (("start", start.strip()), ("end", end.strip())):
        if re.fullmatch(r"-?\d+", given):
            values[key] = int(given)
        elif not (key == "end" and given == "latest"):
            values[f"{key}_time"] = given
    return values


def _from_form(values: dict[str, object]) -> dict[str, object]:
    """The form's fields as `BackfillParams` takes them: a time in place of the offset it replaces (not both), no
    `end` as `latest`, and the partitions' text as a list."""
    for key in ("start", "end"):
        when = values.pop(f"{key}_time", None)
        if when is None:
            continue
        if values.get(key, 0) not in (0, "0", "latest"):
            raise SpecError(f"Backfill parameter '{key}_time': give the {key} as an offset or as a time, not both.",
                            fix=f"Clear '{key}' or '{key}_time'.")
        values[key] = when
    values.setdefault("end", "latest")
    partitions = values.get("partitions")
    if isinstance(partitions, str):
        if re.fullmatch(PARTITIONS_PATTERN, partitions) is None:
            raise SpecError(f"Backfill parameter 'partitions': '{partitions}' is not \"all\" or partition numbers "
                            "separated by commas.", fix="Give all, or numbers such as 0, 2.")
        text = partitions.strip()
        values["partitions"] = "all" if text == "all" else [int(n) for n in text.split(",")]
    return values


def parse_params(spec: PipelineSpec, raw: Mapping[str, object]) -> BackfillParams:
    """Validate backfill parameters (the trigger form's, or the model's own); the error names the field and says
    what to change."""
    values = _from_form({k: v for k, v in raw.items() if v not in (None, "")})
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
    outputs: Callable[[str], KafkaSettings] | None = None,
    registry: Callable[[], Registry] = configured_registry,
) -> BackfillOutcome:
    """Validate, resolve times, plan the fill or the replay, and (unless dry run) insert its batches.

    Each step is one call: the sinks and the transform are checked, the broker resolves the request, the ledger is
    read under the pipeline's lock, the pure planner decides (or refuses, before anything is written), the sinks
    report the rows a replay replaces, and the ledger inserts the batches in the same transaction."""
    params = parse_params(spec, raw_params)
    # The sink tables, the output topics and the transform, before any batch is opened.
    sinks = check_pipeline(spec, ledger, outputs or (lambda _: kafka))
    replay = params.mode == "replay"
    if replay:
        for sink in sinks.values():
            sink.check_replay()
    # A fill pins the registry's schemas now; a replay decodes with those of the batches it replays.
    pins = plan_pins(spec, registry) if not replay and not params.dry_run else None
    requests = requested_ranges(kafka, spec.source.isolation_level, params.topic, params.partitions,
                                params.start, params.end)
    with ledger.transaction() as session:
        pipeline, held = repo.read_backfill_ledger(session, spec, replay=replay)
        plan = plan_backfill_batches(spec.name, params.mode, requests, held,
                                     whole_batches=any(sink.replays_whole_batches for sink in sinks.values()))
        # Per sink that reports it (an aggregate): the rows whose contribution a replay replaces, and their windows.
        affected: dict[str, tuple[int, object, object]] = {}
        keys = [{"b": c.batch_id, "t": c.range.topic, "n": c.range.partition} for c in plan.replay.replace] \
            if plan.replay is not None else []
        for sink in sinks.values() if keys else ():
            footprint = sink.replay_footprint(session, json.dumps(keys))
            if footprint is not None:
                affected[sink.name] = footprint
        batch_ids = [] if params.dry_run else repo.insert_backfill_batches(
            session, pipeline, plan.batches, kind=BatchKind.REPLAY if replay else BatchKind.BACKFILL,
            airflow_run_id=airflow_run_id, formats=pins.formats if pins is not None else None)
        if batch_ids and pins is not None:
            repo.record_schemas(session, pipeline.id, pins.schemas)
    return BackfillOutcome(params, requests, plan.fill, batch_ids, replay=plan.replay, affected_rows=affected)
