"""The sink interface: every sink type of the spec has a module, each says what the stage writes for it, and
the aggregate decides which windows a kafka sink publishes in each kind of commit (no database needed: the
statements run on real Postgres in tests/integration and tests/e2e)."""

from typing import get_args

import pytest
from pydantic import ValidationError
from sqlalchemy import MetaData

from microbatch.config import PIPELINES_DIR, SinkSpec, load_spec
from microbatch.sinks.base import CommitContext
from microbatch.sinks.kafka import outbox_sql
from microbatch.sinks.postgres_aggregate import contributions_sql, merge_aggregate_sql, retract_sql
from microbatch.sinks.registry import SINK_TYPES, sinks_of

SPEC = load_spec(PIPELINES_DIR / "ip_count.yaml")


def context(*, backfill: bool = False, replay: bool = False, before: int | None = 1,
            after: int | None = 2) -> CommitContext:
    return CommitContext(pipeline_id=1, batch_id=7, attempt=3, backfill=backfill, replay=replay,
                         watermark_before=before, watermark_after=after, sinks=sinks_of(SPEC))


def test_every_sink_type_of_the_spec_has_a_module():
    models = get_args(get_args(SinkSpec)[0])
    types = {get_args(model.model_fields["type"].annotation)[0] for model in models}
    assert types == set(SINK_TYPES)


def test_the_stage_writes_the_aggregate_with_its_source_partition_and_nothing_for_kafka():
    sinks = sinks_of(SPEC)
    assert list(sinks) == ["ip_counts", "ip_count_sink"]
    staging = sinks["ip_counts"].staging
    assert staging is not None and staging.table == "stage_ip_counts"
    assert staging.columns == ("topic", "partition", "window_start", "window_end", "ip", "count")
    assert sinks["ip_count_sink"].staging is None


def test_contributions_per_batch_stage_and_keep_the_keys_alone_and_retract_whole_batches():
    spec = SPEC.model_copy(update={"sinks": [SPEC.sinks[0].model_copy(update={"contributions": "per_batch"})]})
    sink = sinks_of(spec)["ip_counts"]
    assert sink.staging.columns == ("window_start", "window_end", "ip", "count")
    tables = {t.name: [c.name for c in t.columns] for t in sink.tables(MetaData())}
    assert tables["ip_counts_contributions"] == ["batch_id", "window_start", "window_end", "ip", "count"]
    assert tables["stage_ip_counts"] == ["batch_id", "attempt", "window_start", "window_end", "ip", "count"]
    assert "JOIN (SELECT DISTINCT batch_id FROM ranges WHERE superseded_by = :batch_id) g" in retract_sql(
        sink.spec)
    assert '"topic"' not in contributions_sql(sink.spec)
    assert '"topic", "partition"' in contributions_sql(SPEC.sinks[0])  # the default keeps them per partition


def test_a_per_batch_contributions_setting_is_validated():
    with pytest.raises(ValidationError, match="contributions"):
        SPEC.sinks[0].model_validate({**SPEC.sinks[0].model_dump(), "contributions": "per_key"})


@pytest.mark.parametrize(
    ("ctx", "published"),
    [
        (context(before=1, after=1), None),  # the watermark did not move: no window became final
        (context(before=None, after=None), None),
        (context(before=1, after=2), {"correction": False, "params": {"low", "high"}}),
        (context(backfill=True, before=None, after=None), None),  # no window is final yet
        (context(backfill=True), {"correction": True, "params": {"batch_id", "attempt", "high"}}),
        (context(backfill=True, replay=True), {"correction": True, "params": {"batch_id", "attempt", "high"}}),
    ],
)
def test_which_windows_a_commit_publishes(ctx: CommitContext, published: dict | None):
    rows = ctx.sinks["ip_counts"].published_rows(ctx)
    if published is None:
        assert rows is None
        return
    assert rows is not None
    assert rows.correction is published["correction"]
    assert set(rows.params) == published["params"]
    assert bool(rows.ctes) is ctx.replay


def test_the_merge_and_the_outbox_statements():
    # The exact text: a change here changes what the commit's one transaction does.
    assert merge_aggregate_sql(SPEC.sinks[0]) == (
        'INSERT INTO "ip_counts" ("window_start", "window_end", "ip", "count") SELECT "window_start", "window_end", '
        '"ip", sum("count") FROM "stage_ip_counts" WHERE batch_id = :batch_id AND attempt = :attempt GROUP BY '
        '"window_start", "window_end", "ip" ON CONFLICT ("window_start", "window_end", "ip") DO UPDATE SET "count" = '
        '"ip_counts"."count" + EXCLUDED."count"'
    )
    ctx = context()
    assert outbox_sql(SPEC.sinks[1], ctx.sinks["ip_counts"].published_rows(ctx)) == (
        "INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) SELECT :pipeline_id, :sink, base.seq + "
        'row_number() OVER (ORDER BY "window_start", "window_end", "ip"), :batch_id, final."ip"::text, '
        'to_jsonb(final) FROM (SELECT "window_start", "window_end", "ip", "count" FROM "ip_counts" WHERE '
        "\"window_end\" > coalesce(:low, '-infinity'::timestamptz) AND \"window_end\" <= :high) AS final, "
        "(SELECT coalesce(max(seq), 0) AS seq FROM outbox WHERE pipeline_id = :pipeline_id AND sink = :sink) AS base "
        "RETURNING seq"
    )
