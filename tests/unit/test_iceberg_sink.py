"""The iceberg sink's tables from the spec, on real Iceberg tables (pyiceberg's SQL catalog on a SQLite file, a
temporary warehouse, no JVM): created with the coordinates and a `day(ts)` partition spec, a new column added,
every other difference refused in one sentence; the pure helpers of the audit (snapshots by batch, orphaned attempt
folders); the refusals of the spec and of a replay."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from microbatch.config import IcebergSink, PipelineSpec
from microbatch.errors import SpecError
from microbatch.sinks import delta, iceberg
from microbatch.sinks.delta import Owner
from microbatch.sinks.registry import sink_for
from microbatch.types import OffsetRange


def sink(**changes: object) -> IcebergSink:
    fields = {"name": "clicks_lake", "type": "iceberg", "columns": {"user": "text", "ts": "timestamptz"},
              "partition_by": ["day(ts)"], **changes}
    return IcebergSink.model_validate(fields)


def spec(lake: IcebergSink) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "clicks", "source": {"topics": ["t"]},
                                        "job": {"transform": "spark_jobs.clicks:transform"},
                                        "sinks": [lake.model_dump()]})


@pytest.fixture
def url(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv(delta.WAREHOUSE_ENV, str(tmp_path / "warehouse"))
    return f"sqlite:///{tmp_path / 'catalog.db'}"


def test_migrate_creates_then_adds_then_refuses(url, tmp_path):
    with pytest.raises(SpecError, match="does not exist; run `microbatch migrate`"):
        iceberg.check_table(spec(sink()), sink(), url)
    assert iceberg.migrate_table(sink(), url) == [
        f"create iceberg table microbatch.clicks_lake at {tmp_path / 'warehouse' / 'clicks_lake'}"]
    iceberg.check_table(spec(sink()), sink(), url)
    table = iceberg.load(sink(), url)
    assert [f.name for f in table.schema().fields] == ["topic", "partition", "offset", "user", "ts"]
    assert str(table.schema().find_field("ts").field_type) == "timestamptz"
    assert iceberg.partition_text(sink(), table) == (["day(ts)"], ["day(ts)"])

    wider = sink(columns={"user": "text", "ts": "timestamptz", "page": "text"})
    with pytest.raises(SpecError, match="lacks the column page the spec declares; run `microbatch migrate`"):
        iceberg.check_table(spec(wider), wider, url)
    assert iceberg.migrate_table(wider, url) == ["add column page to iceberg table microbatch.clicks_lake"]
    iceberg.check_table(spec(wider), wider, url)

    retyped = sink(columns={"user": "bigint", "ts": "timestamptz", "page": "text"})
    with pytest.raises(SpecError, match="column user is string but the spec says long; change the spec back"):
        iceberg.migrate_table(retyped, url)
    assert "has the column page, which the spec no longer declares" in (
        iceberg.differences(sink(), iceberg.load(sink(), url))[1] or "")
    repartitioned = sink(columns={"user": "text", "ts": "timestamptz", "page": "text"}, partition_by=["hour(ts)"])
    assert "is partitioned by ['day(ts)'] but the spec says ['hour(ts)']" in (
        iceberg.differences(repartitioned, iceberg.load(sink(), url))[1] or "")


def test_snapshots_by_batch_tells_owners_apart():
    owner = Owner("clicks", "uid-1", "clicks_lake")
    ranges = [OffsetRange("t", 0, 0, 10)]
    ours = iceberg.summary_properties(owner, 7, 2, ranges) | {"added-records": "10"}
    other = iceberg.summary_properties(Owner("clicks", "uid-2", "clicks_lake"), 7, 1, ranges)
    held, foreign = iceberg.snapshots_by_batch([(1, {"operation": "append"}), (2, ours), (3, other), (4, ours)], owner)
    assert held == {7: [iceberg.LakeSnapshot(2, 10, 2), iceberg.LakeSnapshot(4, 10, 2)]}
    assert foreign == [3]
    assert json.loads(ours["microbatch"])["microbatch"]["ranges"] == [
        {"topic": "t", "partition": 0, "start": 0, "end": 10}]


def test_orphan_folders_are_unreferenced_attempts_of_closed_batches():
    files = [
        "/w/t/data/microbatch-1-1/_p0=1/a.parquet",  # a crash before the commit: orphaned
        "/w/t/data/microbatch-1-1/_p0=1/.a.parquet.crc",
        "/w/t/data/microbatch-1-2/_p0=1/b.parquet",  # the attempt that committed
        "/w/t/data/microbatch-2-1/_p0=1/c.parquet",  # an open batch: in flight, not an orphan
        "/w/t/data/elsewhere/d.parquet",  # not microbatch's
    ]
    referenced = {"/w/t/data/microbatch-1-2/_p0=1/b.parquet"}
    assert iceberg.orphan_folders(files, referenced, open_batches={2}) == {
        "/w/t/data/microbatch-1-1": ["/w/t/data/microbatch-1-1/_p0=1/.a.parquet.crc",
                                     "/w/t/data/microbatch-1-1/_p0=1/a.parquet"]}
    assert iceberg.orphan_folders([f"file://{p}" for p in files], referenced, open_batches=set()).keys() == {
        "file:///w/t/data/microbatch-1-1", "file:///w/t/data/microbatch-2-1"}


def test_spec_and_replay_refusals():
    with pytest.raises(ValidationError, match="needs a timestamp column"):
        sink(columns={"d": "date"}, partition_by=["hour(d)"])
    with pytest.raises(ValidationError, match="is neither a column nor"):
        sink(partition_by=["day(missing)"])
    with pytest.raises(ValidationError):
        sink(mode="upsert")
    with pytest.raises(SpecError, match="sink 'clicks_lake' is an iceberg table, which microbatch cannot replay "
                                        "into yet; nothing was written") as refused:
        sink_for(sink()).check_replay()
    assert "--mode fill" in (refused.value.fix or "")
