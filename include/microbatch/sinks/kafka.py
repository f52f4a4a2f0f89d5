"""`kafka`: publishes rows to a Kafka topic, exactly once, through the outbox.

Its rows are its own (the job's output of its name, or its `sql`: one row per record, with the record's
coordinates, staged to `stage_kafka_<name>` as an append sink's are, with no table of their own), or those of the
sink named in `source` (`Sink.published_rows`: a windowed aggregate's final windows, an append sink's rows).

Its part of the commit is the outbox: one row per record to publish, numbered gap-free after the sink's last
sequence (the commit holds the pipeline row's lock, so numbering cannot race), written in the commit's
transaction; a row keeps its source coordinates there, so that a replay publishes only the rows it changed
(corrections) or no longer gives (retractions). Sending them is its `publish` (`sinks/kafka_publish.py`), which the
publish phase (`phases/publish.py`) asks after the commit, outside this transaction; the topic itself is created by
`microbatch migrate` (`kafka/topics.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.orm import Session

from microbatch.config import KafkaSink
from microbatch.ledger import repository as repo
from microbatch.sinks.base import CommitContext, Sink, quote, sql_type, staging_columns
from microbatch.sinks.capabilities import Publisher
from microbatch.sinks.contexts import AssetRef, LineagePlaces, Outbox, PublishedRows, PublishRun, Staging, table_asset
from microbatch.sinks.postgres_append import coordinate_columns, published_staged_rows

if TYPE_CHECKING:
    from microbatch.settings import KafkaSettings


def outbox_sql(sink: KafkaSink, rows: PublishedRows) -> str:
    """The outbox rows of `rows`, keyed by the sink's key column, each value the row as JSON (the ledger writes
    the outbox: `repository.outbox_insert_sql`, or `outbox_row_changes_sql` for a replay of rows)."""
    if rows.replay_rows is not None:
        return repo.outbox_row_changes_sql(rows.replay_rows, quote(sink.key))
    return repo.outbox_insert_sql(rows.relation, rows.order, quote(sink.key), correction=rows.correction,
                                  ctes=rows.ctes, coordinates=rows.coordinates)


class KafkaTopic(Sink, Publisher):
    type = "kafka"
    spec: KafkaSink

    def __init__(self, spec: KafkaSink) -> None:
        super().__init__(spec)
        if spec.own_rows:
            self.staging = Staging(
                table=spec.staging_table,
                columns=(*(spec.columns or {}), "topic", "partition", "offset"),
                fix="Return the sink's columns plus the source topic, partition and offset of each record's row.",
            )

    @property
    def published_topic(self) -> str:
        return self.spec.topic

    @property
    def include_late(self) -> bool:
        return self.spec.own_rows and self.spec.include_late

    def assets(self, pipeline: str) -> list[AssetRef]:
        """The output topic, by the sink's name."""
        return [table_asset(pipeline, self.name)]

    def lineage_output(self, places: LineagePlaces, rows_by_sink: Mapping[str, int],
                       outbox: Mapping[str, tuple[int, int]], staged: Mapping[str, int]) -> tuple[str, str, int]:
        """The topic, with the outbox rows this batch wrote for it."""
        first, last = outbox.get(self.name, (1, 0))
        return places.kafka, self.spec.topic, last - first + 1

    def tables(self, metadata: sa.MetaData) -> list[sa.Table]:
        """Own rows: their staging table (`batch_id`, `attempt`, the columns, the source coordinates); the
        published rows themselves live in the outbox and the topic."""
        spec = self.spec
        if not spec.own_rows:
            return []
        staging = sa.Table(
            spec.staging_table, metadata,
            *staging_columns(),
            *(sa.Column(name, sql_type(kind), nullable=True) for name, kind in (spec.columns or {}).items()),
            *coordinate_columns(),
            sa.Index(f"ix_{spec.staging_table}_batch", "batch_id", "attempt"),
        )
        return [staging]

    def published_rows(self, ctx: CommitContext) -> PublishedRows | None:
        """Own rows: each staged row once (a replay: what changed); else its source sink's answer."""
        if self.spec.own_rows:
            return published_staged_rows(self.spec, ctx)
        return ctx.sinks[self.spec.source].published_rows(ctx)  # type: ignore[index]

    def outbox_label(self, ctx: CommitContext) -> str:
        """What the published rows are (windows that became final, rows, corrections, retractions)."""
        rows = self.published_rows(ctx)
        return "record(s)" if rows is None else rows.label

    def write_outbox(self, session: Session, ctx: CommitContext) -> tuple[int, int] | None:
        rows = self.published_rows(ctx)
        if rows is None:
            return None
        return repo.append_outbox(session, ctx.pipeline_id, self.name, ctx.batch_id, outbox_sql(self.spec, rows),
                                  rows.params)

    def publish(self, outbox: Outbox, kafka: KafkaSettings) -> PublishRun:
        """The outbox rows the topic lacks, sent in Kafka transactions (`sinks/kafka_publish.py`)."""
        from microbatch.sinks.kafka_publish import publish_outbox  # kafka-python: only the publish task needs it

        return publish_outbox(self.spec, outbox, kafka)
