"""Re-processing dead letters (`microbatch reprocess`) as data: the dead letters a filter chooses, and the committed
ranges that hold them as backfill replay requests (one per range, as `backfill --mode replay`), each refused before
anything runs when it cannot replay."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.ledger import queries
from microbatch.ledger.database import Ledger
from microbatch.ledger.queries import DeadLetterView
from microbatch.phases.backfill import form_params, plan_backfill
from microbatch.phases.reset import parse_time
from microbatch.settings import KafkaSettings


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters: of one batch, topic or partition, with a Kafka timestamp in [since, until), with a reason
    that contains some text (any case); None is any."""

    batch: int | None = None
    topic: str | None = None
    partition: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    reason: str | None = None

    @classmethod
    def parse(cls, batch: int | None, topic: str | None, partition: int | None, since: str | None,
              until: str | None, reason: str | None) -> LetterFilter:
        """The filter of the CLI's options, its times given as ISO-8601 text."""
        times = {name: parse_time(value) if value else None for name, value in (("since", since), ("until", until))}
        return cls(batch, topic, partition, reason=reason, **times)


def matching_dead_letters(session: Session, pipeline_id: int, chosen: LetterFilter,
                          limit: int | None) -> list[DeadLetterView]:
    """The pipeline's dead letters that `chosen` matches, by topic, partition and offset; at most `limit`."""
    return queries.dead_letters(session, pipeline_id, batch_id=chosen.batch, topic=chosen.topic,
                                partition=chosen.partition, reason=chosen.reason, limit=limit, since=chosen.since,
                                until=chosen.until)


@dataclass
class ReprocessPlan:
    """The dead letters to re-process, by the committed range that holds them, and one replay request per range."""

    letters: list[DeadLetterView]
    ranges: dict[tuple[str, int, int, int], list[DeadLetterView]]
    """(topic, partition, start, end) of each committed range: the dead letters it holds."""
    requests: list[dict[str, object]]
    """The backfill DAG's parameters of each range's replay (`phases/backfill.py`'s `form_params`)."""

    def replays(self) -> list[dict[str, object]]:
        """The parameters of each replay's backfill DAG run, for real (not a dry run)."""
        return [{**request, "dry_run": False} for request in self.requests]

    def rows(self) -> list[tuple[str, int, str, int, int]]:
        """Per range: topic, partition, the range, the batch that committed it and its dead letters' count."""
        return [(t, p, f"[{start}, {end})", held[0].batch_id, len(held))
                for (t, p, start, end), held in self.ranges.items()]


def plan_reprocess(spec: PipelineSpec, letters: list[DeadLetterView], ledger: Ledger,
                   kafka: KafkaSettings) -> ReprocessPlan:
    """The replays that re-process `letters`; a range that cannot replay (a sink that takes no replay, a range now
    open) is refused here, before anything runs."""
    ranges: dict[tuple[str, int, int, int], list[DeadLetterView]] = {}
    for letter in letters:
        ranges.setdefault((letter.topic, letter.partition, letter.range_start, letter.range_end), []).append(letter)
    requests = [form_params(t, str(start), str(end), str(p), "replay", dry_run=False)
                for (t, p, start, end) in ranges]
    for request in requests:
        plan_backfill(spec, {**request, "dry_run": True}, ledger, kafka)
    return ReprocessPlan(letters, ranges, requests)
