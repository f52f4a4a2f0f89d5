"""`microbatch reset`: an operator moves positions, once, on the record.

A reset is refused while any batch is open. Moving forward skips offsets: they are recorded as a
gap, so the audit still accounts for every offset. Moving back over committed offsets is refused
(they would be processed twice). Each move is a compare-and-set from the position the operator
confirmed, with an audit row, so it applies exactly once.

`plan_reset` does the broker look-ups and the ledger checks and writes nothing; `apply_reset` writes the
confirmed moves. The CLI only takes the arguments, shows the plan and asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.errors import SpecError
from microbatch.kafka.offsets import (
    discover_partitions,
    offset_bounds,
    offsets_client,
    offsets_for_time,
    source_partitions,
)
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger
from microbatch.ledger.state import reset_state
from microbatch.settings import KafkaSettings
from microbatch.types import TopicPartition, micros_time

Target = Literal["earliest", "latest", "offset", "timestamp"]
TARGETS: tuple[Target, ...] = ("earliest", "latest", "offset", "timestamp")


@dataclass(frozen=True)
class ResetMove:
    tp: TopicPartition
    old: int | None
    new: int

    @property
    def skipped(self) -> int:
        return max(0, self.new - (self.old if self.old is not None else self.new))


@dataclass(frozen=True)
class ResetPlan:
    """What a reset would do: the position the target resolves to on the broker, and the moves from the ledger's."""

    target: Target
    new: dict[TopicPartition, int]
    moves: list[ResetMove]


def check_target(to: str, value: str | None) -> None:
    """Refuse a bad `--to` or `--value` before anything is looked up (SpecError, one sentence)."""
    if to not in TARGETS:
        raise SpecError(f"reset: --to '{to}' is not a target.", fix="Use earliest, latest, offset or timestamp.")
    if to in ("offset", "timestamp") and value is None:
        raise SpecError(f"reset --to {to} needs --value.", fix="Give the offset, or the time as ISO-8601.")
    if to == "timestamp":
        parse_time(value)  # type: ignore[arg-type]
    if to == "offset":
        parse_offset(value)  # type: ignore[arg-type]


def plan_reset(
    spec: PipelineSpec,
    to: str,
    value: str | None,
    topic: str | None,
    partition: int | None,
    kafka: KafkaSettings,
    ledger: Ledger,
) -> ResetPlan:
    """Resolve the target on the broker (one topic or the pipeline's, one partition or all) and check it
    against the ledger; nothing is written."""
    check_target(to, value)
    target: Target = to  # type: ignore[assignment]
    new = _resolve_on_broker(spec, target, value, topic, partition, kafka)
    with ledger.transaction() as session:
        pipeline = repo.get_pipeline(session, spec.name)
        if pipeline is None:  # never ran: every partition gets its first position
            return ResetPlan(target, new, [ResetMove(tp, None, offset) for tp, offset in sorted(new.items())])
        return ResetPlan(target, new, plan_moves(session, pipeline.id, new))


def apply_reset(spec: PipelineSpec, plan: ResetPlan, ledger: Ledger, operator: str) -> None:
    """Apply the moves the operator confirmed, exactly once, in one transaction under the pipeline's lock:
    the checks run again (a batch opened since is refused), then each move is a compare-and-set from the
    position that was shown, with its gap and audit row."""
    with ledger.transaction() as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        plan_moves(session, pipeline.id, {move.tp: move.new for move in plan.moves})
        for move in plan.moves:
            repo.reset_position(session, pipeline.id, move.tp, move.old, move.new,
                                target=plan.target, operator=operator)


def _resolve_on_broker(
    spec: PipelineSpec, target: Target, value: str | None, topic: str | None, partition: int | None,
    kafka: KafkaSettings,
) -> dict[TopicPartition, int]:
    with offsets_client(kafka, spec.source.isolation_level) as consumer:
        partitions = [tp for tp in (discover_partitions(consumer, [topic]) if topic
                                    else source_partitions(consumer, spec.source))
                      if partition is None or tp.partition == partition]
        if not partitions:
            raise SpecError(f"reset: partition {partition} does not exist.", fix="Check --partition.")
        earliest, latest = offset_bounds(consumer, partitions)
        for_time = None
        if target == "timestamp":
            millis = int(parse_time(value).timestamp() * 1000)  # type: ignore[arg-type]
            for_time = offsets_for_time(consumer, partitions, millis)
    return resolve_target(target, value, earliest, latest, for_time)


def resolve_target(
    target: Target,
    value: str | None,
    earliest: dict[TopicPartition, int],
    latest: dict[TopicPartition, int],
    for_time: dict[TopicPartition, int | None] | None = None,
) -> dict[TopicPartition, int]:
    """The new position of each partition (pure)."""
    if target in ("offset", "timestamp") and value is None:
        raise SpecError(f"reset --to {target} needs --value.", fix="Give the offset, or the time as ISO-8601.")
    new = {}
    for tp, high in latest.items():
        if target == "earliest":
            new[tp] = earliest[tp]
        elif target == "latest":
            new[tp] = high
        elif target == "offset":
            new[tp] = parse_offset(value)  # type: ignore[arg-type]
        else:
            found = (for_time or {}).get(tp)
            new[tp] = high if found is None else found
        if not earliest[tp] <= new[tp] <= high:
            raise SpecError(
                f"reset: offset {new[tp]} is outside {tp}'s retained offsets [{earliest[tp]}, {high}].",
                fix="Choose an offset inside that range.",
            )
    return new


def plan_moves(session: Session, pipeline_id: int, new: dict[TopicPartition, int]) -> list[ResetMove]:
    """Check the reset against the ledger and return the moves; nothing is written."""
    open_batches = repo.open_batch_ids(session, pipeline_id)
    if open_batches:
        raise SpecError(
            f"reset refused: batch(es) {', '.join(map(str, open_batches))} are still open.",
            fix="Let them commit (or fail) first, then reset.",
        )
    positions = repo.read_positions(session, pipeline_id)
    moves = []
    for tp, offset in sorted(new.items()):
        old = positions.get(tp)
        if old is not None and offset < old and repo.committed_beyond(session, pipeline_id, tp, offset):
            raise SpecError(
                f"reset refused: {tp} offsets [{offset}, {old}) are already committed; moving back would "
                "process them twice.",
                fix="Reset forward only, or backfill the offsets you need.",
            )
        if old != offset:
            moves.append(ResetMove(tp, old, offset))
    return moves


def parse_offset(value: str) -> int:
    """`--value` of `reset --to offset`: a whole number, or a SpecError naming it."""
    try:
        offset = int(value)
    except ValueError:
        offset = -1
    if offset < 0:
        raise SpecError(f"reset: --value '{value}' is not an offset.", fix="Give a whole number of 0 or more.")
    return offset


def parse_time(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(f"reset: '{value}' is not an ISO-8601 time.", fix="Use e.g. 2026-11-22T12:00:00Z.") from None


# --- the watermark (`microbatch reset --watermark`) ---------------------------------------------------------

WATERMARK_KEYS = ("watermark_us", "max_event_time_us")
"""The event-time part of a pipeline's state (`event_time.watermark_after`)."""


def time_text(micros: Any) -> str:
    """A state's time (microseconds since the epoch) as ISO-8601 UTC; one past year 9999 as its number, said so."""
    moment = micros_time(micros)
    if moment is None:
        return f"{micros} µs since 1970 (past year 9999: no time can hold it)"
    return moment.isoformat().replace("+00:00", "Z")


def watermark_state(state: dict[str, Any], target: str) -> dict[str, Any]:
    """The pipeline state with its watermark cleared (`clear`: the next batch starts it again from its own event
    times) or set to an ISO-8601 time with a zone; the job's other values stay."""
    kept = {key: value for key, value in state.items() if key not in WATERMARK_KEYS}
    if target == "clear":
        return kept
    moment = parse_time(target)
    if moment.tzinfo is None:
        raise SpecError(f"reset --watermark '{target}' has no time zone.",
                        fix="Write it with one, e.g. 2026-11-29T08:00:00Z.")
    micros = int(moment.timestamp() * 1_000_000)
    return {**kept, "watermark_us": micros, "max_event_time_us": micros}


@dataclass(frozen=True)
class WatermarkPlan:
    pipeline_id: int
    target: str
    old: dict[str, Any]
    new: dict[str, Any]


def plan_watermark(spec: PipelineSpec, target: str, ledger: Ledger) -> WatermarkPlan:
    """What `reset --watermark TARGET` would make of the pipeline's state; nothing is written."""
    if target != "clear":
        parse_time(target)
    with ledger.transaction() as session:
        pipeline = repo.get_pipeline(session, spec.name)
        if pipeline is None:
            raise SpecError(f"reset: the ledger has no pipeline '{spec.name}' yet; it has no state to reset.",
                            fix=f"Run it first: microbatch run {spec.name}.")
        old = dict(pipeline.state or {})
        return WatermarkPlan(pipeline.id, target, old, watermark_state(old, target))


def apply_watermark(plan: WatermarkPlan, ledger: Ledger, operator: str) -> None:
    """Apply the state the operator confirmed, once, on the record (`ledger/state.reset_state`)."""
    with ledger.transaction() as session:
        reset_state(session, plan.pipeline_id, plan.old, plan.new, target=f"watermark {plan.target}",
                    operator=operator)
