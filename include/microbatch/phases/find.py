"""Who accounts for one offset of a pipeline (`microbatch find`): the committed batch that processed it and the
lakehouse table versions that hold that batch, the gap that lost it, or nobody yet; as data and as sentences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from microbatch.config import find_spec
from microbatch.errors import SpecError
from microbatch.ledger import lake, queries
from microbatch.ledger import repository as repo
from microbatch.sinks.base import Sink
from microbatch.sinks.capabilities import LakeTable
from microbatch.sinks.registry import sinks_of


@dataclass(frozen=True)
class OffsetFinding:
    """One offset and who accounts for it."""

    topic: str
    partition: int
    offset: int
    owner: queries.OffsetOwner
    held: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Per lakehouse sink, the table location and the version that holds the owning batch."""
    position: int | None = None
    """The partition's position (the next offset the pipeline reads)."""

    def as_dict(self) -> dict[str, Any]:
        """The finding as `find --json` prints it."""
        return {**queries.to_dict(self.owner), "tables": {s: {"location": loc, "version": v}
                                                          for s, (loc, v) in self.held.items()}}


def find_offset(session: Session, pipeline: str, pipeline_id: int, topic: str, partition: int,
                offset: int) -> OffsetFinding:
    """Who accounts for TOPIC[PARTITION] OFFSET; a topic or partition the pipeline never read is refused."""
    positions = repo.read_positions(session, pipeline_id)
    owner = queries.find_offset(session, pipeline_id, topic, partition, offset)
    held = lake.lake_versions_of_batch(session, pipeline_id, owner.batch_id) if owner.kind == "batch" else {}
    read = sorted({tp.topic for tp in positions})
    if topic not in read:
        raise SpecError(f"Pipeline '{pipeline}' has never read a topic '{topic}' (it has read "
                        f"{', '.join(read) or 'nothing yet'}).", fix="Check the topic name.")
    known = sorted(tp.partition for tp in positions if tp.topic == topic)
    if partition not in known:
        raise SpecError(f"Pipeline '{pipeline}' has never read partition {partition} of {topic} (it has read "
                        f"partitions {', '.join(map(str, known))}).", fix="Check the partition number.")
    position = next(p for tp, p in positions.items() if tp.topic == topic and tp.partition == partition)
    return OffsetFinding(topic, partition, offset, owner, held, position)


def sinks_or_none(pipeline: str) -> dict[str, Sink]:
    """The pipeline's sinks by name, or none when its spec is gone (the ledger outlives it)."""
    try:
        return sinks_of(find_spec(pipeline))
    except SpecError:
        return {}


def finding_lines(pipeline: str, found: OffsetFinding) -> list[str]:
    """The finding in sentences, as `find` prints them: the owner, then each table version that holds its batch."""
    owner, topic, partition, offset = found.owner, found.topic, found.partition, found.offset
    if owner.kind == "batch":
        lines = [f"{topic}[{partition}] offset {offset} was processed by batch {owner.batch_id} "
                 f"(range [{owner.start}, {owner.end}), Airflow run {owner.airflow_run_id})"
                 + (f": dead letter: {owner.dead_letter}" if owner.dead_letter else "")]
        sinks = sinks_or_none(pipeline)
        for sink, (loc, version) in found.held.items():
            one = sinks.get(sink)
            text = (one.holding_text(loc, version) if isinstance(one, LakeTable)
                    else f"{sink}: in version {version} of {loc}")
            lines.append(f"  {text}")
        return lines
    if owner.kind == "gap":
        return [f"{topic}[{partition}] offset {offset} was lost: gap [{owner.start}, {owner.end}) "
                f"recorded by {f'batch {owner.batch_id}' if owner.batch_id else 'an operator'}: {owner.reason}"]
    return [f"{topic}[{partition}] offset {offset} has not been processed yet (the position is {found.position})"]
