"""`kafka`: publishes the rows of another sink to a Kafka topic, exactly once, through the outbox.

Its part of the commit is the outbox: one row per record to publish, numbered gap-free after the sink's
last sequence (the commit holds the pipeline row's lock, so numbering cannot race), written in the
commit's transaction. Which rows to publish is the source sink's answer (`Sink.published_rows`). Sending
them is the publish phase (`phases/publish.py`), outside this transaction.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import Session

from microbatch.config import KafkaSink
from microbatch.ledger import repository as repo
from microbatch.sinks.base import AssetRef, CommitContext, LineagePlaces, PublishedRows, Sink, quote, table_asset


def outbox_sql(sink: KafkaSink, rows: PublishedRows) -> str:
    """One outbox row per row of `rows`, keyed by the sink's key column, its value the row as JSON, numbered
    in `rows.order` after the sink's last sequence (the ledger writes the outbox: `repository.outbox_insert_sql`)."""
    return repo.outbox_insert_sql(rows.relation, rows.order, quote(sink.key), correction=rows.correction,
                                  ctes=rows.ctes)


class KafkaTopic(Sink):
    type = "kafka"
    publishes = True
    spec: KafkaSink

    @property
    def published_topic(self) -> str:
        return self.spec.topic

    def assets(self, pipeline: str) -> list[AssetRef]:
        """The output topic, by the sink's name."""
        return [table_asset(pipeline, self.name)]

    def lineage_output(self, places: LineagePlaces, rows_by_sink: Mapping[str, int],
                       outbox: Mapping[str, tuple[int, int]], staged: Mapping[str, int]) -> tuple[str, str, int]:
        """The topic, with the outbox rows this batch wrote for it."""
        first, last = outbox.get(self.name, (1, 0))
        return places.kafka, self.spec.topic, last - first + 1

    def outbox_label(self, ctx: CommitContext) -> str:
        """What its source sink says the published rows are (windows that became final, rows, corrections)."""
        rows = ctx.sinks[self.spec.source].published_rows(ctx)
        return "record(s)" if rows is None else rows.label

    def write_outbox(self, session: Session, ctx: CommitContext) -> tuple[int, int] | None:
        rows = ctx.sinks[self.spec.source].published_rows(ctx)
        if rows is None:
            return None
        return repo.append_outbox(session, ctx.pipeline_id, self.name, ctx.batch_id, outbox_sql(self.spec, rows),
                                  rows.params)
