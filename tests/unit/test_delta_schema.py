"""The delta sink's tables from the spec, on real Delta tables in a temporary warehouse (delta-rs, no JVM):
created with the coordinates first and a generated partition column, a new column added, and every other
difference refused in one sentence naming the table and the column; pure helpers of the write path."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from microbatch.config import DeltaSink, PipelineSpec
from microbatch.errors import SpecError
from microbatch.sinks import delta
from microbatch.types import OffsetRange


def sink(**changes: object) -> DeltaSink:
    fields = {"name": "clicks_lake", "type": "delta", "columns": {"user": "text", "ts": "timestamptz"},
              "partition_by": ["day(ts)"], **changes}
    return DeltaSink.model_validate(fields)


def spec(lake: DeltaSink) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "clicks", "source": {"topics": ["t"]},
                                        "job": {"transform": "spark_jobs.clicks:transform"},
                                        "sinks": [lake.model_dump()]})


@pytest.fixture(autouse=True)
def warehouse(tmp_path, monkeypatch):
    monkeypatch.setenv(delta.WAREHOUSE_ENV, str(tmp_path))
    return tmp_path


def test_migrate_creates_then_adds_then_refuses(warehouse):
    with pytest.raises(SpecError, match="does not exist; run `microbatch migrate`"):
        delta.check_table(spec(sink()), sink())
    assert delta.migrate_table(sink()) == [f"create delta table {warehouse / 'clicks_lake'}"]
    table = DeltaTable(str(warehouse / "clicks_lake"))
    assert [f.name for f in table.schema().fields] == ["topic", "partition", "offset", "user", "ts", "ts_day"]
    assert table.metadata().partition_columns == ["ts_day"]
    delta.check_table(spec(sink()), sink())
    assert delta.migrate_table(sink()) == []

    grown = sink(columns={"user": "text", "ts": "timestamptz", "page": "text"})
    with pytest.raises(SpecError, match="lacks the column page"):
        delta.check_table(spec(grown), grown)
    assert delta.migrate_table(grown) == [f"add column page to delta table {warehouse / 'clicks_lake'}"]
    delta.check_table(spec(grown), grown)

    retyped = sink(columns={"user": "bigint", "ts": "timestamptz", "page": "text"})
    with pytest.raises(SpecError, match="column user is string but the spec says long"):
        delta.migrate_table(retyped)
    dropped = sink()
    with pytest.raises(SpecError, match="has the column page, which the spec no longer declares"):
        delta.check_table(spec(dropped), dropped)
    repartitioned = sink(columns={"user": "text", "ts": "timestamptz", "page": "text"}, partition_by=["user"])
    with pytest.raises(SpecError, match="partitioned by"):
        delta.migrate_table(repartitioned)


def test_spec_refuses_what_the_modes_cannot_do():
    for bad, words in (({"mode": "upsert"}, "list the key columns"), ({"keys": ["user"]}, "only an upsert"),
                       ({"partition_by": ["day(user)"]}, "needs a timestamp"),
                       ({"partition_by": ["nosuch"]}, "neither a column"),
                       ({"columns": {"offset": "bigint"}}, "platform adds itself")):
        with pytest.raises(ValueError, match=words):
            sink(**bad)


def test_write_path_helpers():
    ranges = [OffsetRange("t", 0, 5, 9), OffsetRange("it's", 1, 0, 3)]
    assert delta.replace_where(ranges) == (
        "(`topic` = 't' AND `partition` = 0 AND `offset` >= 5 AND `offset` < 9) OR "
        "(`topic` = 'it''s' AND `partition` = 1 AND `offset` >= 0 AND `offset` < 3)")
    owner = delta.Owner("clicks", "u-1", "clicks_lake")
    meta = delta.commit_metadata(owner, 7, 2, ranges)
    assert delta.batch_of(meta, owner)["batch_id"] == 7
    assert delta.batch_of(meta, delta.Owner("clicks", "u-2", "clicks_lake")) is None, "another ledger's batch"
    assert delta.microbatch_meta(json.dumps({"other": 1})) is None
    assert delta.app_id(owner, 7) == "microbatch/clicks/u-1/clicks_lake/7"
    upsert = sink(mode="upsert", keys=["user"], order_by="ts", delete_column="forget")
    sql = delta.merge_sql(upsert, "/w/t", "v")
    # A tombstone is kept as the key's row (flagged), never deleted, so that an older record cannot revive it.
    assert "THEN DELETE" not in sql and "`_deleted` = coalesce(s.`forget`, false)" in sql
    assert "INSERT (`topic`, `partition`, `offset`, `user`, `ts`, `_deleted`)" in sql
    assert "WHEN NOT MATCHED THEN INSERT" in sql and "WHEN NOT MATCHED AND" not in sql
    assert "(t.`ts` IS NULL AND s.`ts` IS NOT NULL)" in sql, "a null order value is the lowest"
    paged = sink(mode="upsert", keys=["user"], order_by="ts", columns={"user": "text", "page": "text",
                                                                        "ts": "timestamptz"})
    assert delta.tombstone_sql(paged, "s") == "(s.`page` IS NULL)", "all value columns null is a tombstone"
    assert ("_deleted", "boolean", None) in delta.table_fields(paged)
    assert ("_deleted", "boolean", None) not in delta.table_fields(sink())
