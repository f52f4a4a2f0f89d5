"""The row sinks (`postgres_append`, `postgres_upsert`): what the stage writes for them, their tables, and
the statements of their part of the commit (the statements run on real Postgres in
tests/e2e/test_append_sink_e2e.py)."""

from __future__ import annotations

import sqlalchemy as sa

from microbatch.config import KafkaSink, PostgresAppendSink, PostgresUpsertSink
from microbatch.sinks.base import CommitContext
from microbatch.sinks.kafka import outbox_sql
from microbatch.sinks.postgres_append import PostgresAppend, delete_replaced_sql, insert_rows_sql
from microbatch.sinks.postgres_upsert import PostgresUpsert, add_versions_sql, merge_sql, retract_sql, tombstone_sql
from microbatch.sinks.registry import sink_for

APPEND = PostgresAppendSink(name="clicks_raw", type="postgres_append", table="clicks_raw",
                            columns={"user": "text", "page": "text", "ts": "timestamptz"})
UPSERT = PostgresUpsertSink(name="last_page", type="postgres_upsert", table="last_page",
                            columns={"user": "text", "page": "text", "ts": "timestamptz"}, keys=["user"],
                            order_by="ts", delete_column="gone")


def context(*, replay: bool = False) -> CommitContext:
    sinks = {"clicks_raw": sink_for(APPEND)}
    return CommitContext(pipeline_id=1, batch_id=7, attempt=3, backfill=replay, replay=replay,
                         watermark_before=None, watermark_after=None, sinks=sinks)


def test_the_registry_builds_the_row_sinks():
    assert isinstance(sink_for(APPEND), PostgresAppend)
    assert isinstance(sink_for(UPSERT), PostgresUpsert)


def test_the_stage_writes_each_row_with_its_source_coordinates():
    staging = sink_for(APPEND).staging
    assert staging is not None and staging.table == "stage_clicks_raw"
    assert staging.columns == ("user", "page", "ts", "topic", "partition", "offset")
    upsert = sink_for(UPSERT).staging
    assert upsert is not None and upsert.columns == ("user", "page", "ts", "gone", "topic", "partition", "offset")


def test_late_records_reach_a_row_sink_only_with_include_late():
    from microbatch.phases.stage import takes_late_records

    assert takes_late_records(sink_for(APPEND))
    assert not takes_late_records(sink_for(APPEND.model_copy(update={"include_late": False})))
    assert takes_late_records(sink_for(UPSERT))


def test_the_append_tables_key_rows_by_their_coordinates():
    metadata = sa.MetaData()
    table, staging = sink_for(APPEND).tables(metadata)
    assert [c.name for c in table.primary_key.columns] == ["topic", "partition", "offset"]
    assert [c.name for c in table.columns] == ["user", "page", "ts", "topic", "partition", "offset"]
    assert [c.name for c in staging.columns] == ["batch_id", "attempt", "user", "page", "ts", "topic", "partition",
                                                 "offset"]
    assert [list(ix.columns.keys()) for ix in staging.indexes] == [["batch_id", "attempt"]]


def test_the_append_statements():
    assert insert_rows_sql(APPEND) == (
        'INSERT INTO "clicks_raw" ("user", "page", "ts", "topic", "partition", "offset") SELECT "user", "page", '
        '"ts", "topic", "partition", "offset" FROM "stage_clicks_raw" WHERE batch_id = :batch_id AND attempt = '
        ":attempt"
    )
    assert delete_replaced_sql(APPEND) == (
        'DELETE FROM "clicks_raw" AS s USING ranges g WHERE g.superseded_by = :batch_id AND s.topic = g.topic '
        'AND s."partition" = g.partition AND s."offset" >= g.start_offset AND s."offset" < g.end_offset'
    )


def test_a_kafka_sink_publishes_each_staged_row_and_of_a_replay_only_what_changed():
    rows = context().sinks["clicks_raw"].published_rows(context())
    assert rows is not None and not rows.correction and rows.coordinates and rows.replay_rows is None
    assert rows.order == '"topic", "partition", "offset"'
    assert set(rows.params) == {"batch_id", "attempt"}
    replayed = context(replay=True).sinks["clicks_raw"].published_rows(context(replay=True))
    assert replayed is not None and replayed.correction
    assert replayed.replay_rows == ('SELECT "user", "page", "ts", "topic", "partition", "offset" FROM '
                                    '"stage_clicks_raw" WHERE batch_id = :batch_id AND attempt = :attempt')
    statement = outbox_sql(KafkaSink(name="out", type="kafka", topic="o", source="clicks_raw", key="user"), replayed)
    # Against the last value published per coordinates in the superseded ranges: changed rows, and retractions.
    assert "DISTINCT ON (o.src_topic, o.src_partition, o.src_offset)" in statement
    assert "o.value - 'correction' <> to_jsonb(n)" in statement and "'retraction', true" in statement


def test_the_upsert_orders_versions_and_knows_its_tombstones():
    assert tombstone_sql(UPSERT, "s") == 'coalesce(s."gone", false) OR (s."page" IS NULL)'
    assert "ORDER BY s.\"topic\", s.\"partition\", s.\"user\", s.\"ts\" DESC NULLS LAST, s.\"topic\" DESC, " \
           's."partition" DESC, s."offset" DESC' in add_versions_sql(UPSERT)
    _, delete, insert = merge_sql(UPSERT)
    assert delete.startswith('DELETE FROM "last_page" t USING (SELECT DISTINCT "user" FROM "stage_last_page"')
    assert insert.endswith("WHERE NOT w.deleted")
    _, rebuild_insert, drop = retract_sql(UPSERT)
    assert "AND NOT (EXISTS (SELECT 1 FROM ranges g WHERE g.superseded_by = :batch_id" in rebuild_insert
    assert drop.startswith('DELETE FROM "last_page_versions" r WHERE EXISTS')


def test_the_upsert_tables():
    table, versions, staging = sink_for(UPSERT).tables(sa.MetaData())
    assert [c.name for c in table.primary_key.columns] == ["user"]
    assert "deleted" in versions.columns and "gone" not in table.columns
    assert "gone" in staging.columns
