"""`microbatch reset`: an operator moves positions, once, on the record.

A reset is refused while any batch is open. Moving forward skips offsets: they are recorded as a
gap, so the audit still accounts for every offset. Moving back over committed offsets is refused
(they would be processed twice). Each move is a compare-and-set from the position the operator
confirmed, with an audit row, so it applies exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.errors import ConcurrentCommitError, SpecError
from microbatch.types import TopicPartition

Target = Literal["earliest", "latest", "offset", "timestamp"]


@dataclass(frozen=True)
class ResetMove:
    tp: TopicPartition
    old: int | None
    new: int

    @property
    def skipped(self) -> int:
        return max(0, self.new - (self.old if self.old is not None else self.new))


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
    open_batches = session.execute(
        text("SELECT id FROM batches WHERE pipeline_id = :p AND state IN ('planned', 'staged') ORDER BY id"),
        {"p": pipeline_id},
    ).scalars().all()
    if open_batches:
        raise SpecError(
            f"reset refused: batch(es) {', '.join(map(str, open_batches))} are still open.",
            fix="Let them commit (or fail) first, then reset.",
        )
    moves = []
    for tp, offset in sorted(new.items()):
        old = session.execute(
            text("SELECT next_offset FROM positions WHERE pipeline_id = :p AND topic = :t AND partition = :n"),
            {"p": pipeline_id, "t": tp.topic, "n": tp.partition},
        ).scalar_one_or_none()
        if old is not None and offset < old:
            committed_end = session.execute(
                text("SELECT max(end_offset) FROM ranges WHERE pipeline_id = :p AND topic = :t AND partition = :n "
                     "AND committed AND end_offset > :o"),
                {"p": pipeline_id, "t": tp.topic, "n": tp.partition, "o": offset},
            ).scalar_one_or_none()
            if committed_end is not None:
                raise SpecError(
                    f"reset refused: {tp} offsets [{offset}, {old}) are already committed; moving back would "
                    "process them twice.",
                    fix="Reset forward only, or backfill the offsets you need.",
                )
        if old != offset:
            moves.append(ResetMove(tp, old, offset))
    return moves


def apply_moves(session: Session, pipeline_id: int, moves: list[ResetMove], target: str, operator: str) -> None:
    """Compare-and-set each move, record skipped offsets as a gap, and write the audit rows."""
    for move in moves:
        params = {"p": pipeline_id, "t": move.tp.topic, "n": move.tp.partition, "old": move.old, "new": move.new}
        if move.old is None:
            changed = session.execute(
                text("INSERT INTO positions (pipeline_id, topic, partition, next_offset) VALUES (:p, :t, :n, :new) "
                     "ON CONFLICT DO NOTHING"), params).rowcount
        else:
            changed = session.execute(
                text("UPDATE positions SET next_offset = :new, updated_at = now() WHERE pipeline_id = :p "
                     "AND topic = :t AND partition = :n AND next_offset = :old"), params).rowcount
        if changed != 1:
            raise ConcurrentCommitError(f"reset: the position of {move.tp} changed since it was read.",
                                        fix="Nothing was written. Run the reset again.")
        if move.old is not None and move.new > move.old:
            session.execute(
                text("INSERT INTO gaps (pipeline_id, topic, partition, start_offset, end_offset, reason) "
                     "VALUES (:p, :t, :n, :old, :new, :reason)"),
                {**params, "reason": f"skipped by microbatch reset --to {target} ({operator})"},
            )
        session.execute(
            text("INSERT INTO position_resets (pipeline_id, topic, partition, old_offset, new_offset, target, "
                 "operator) VALUES (:p, :t, :n, :old, :new, :target, :operator)"),
            {**params, "target": target, "operator": operator},
        )


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
