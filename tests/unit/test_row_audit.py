"""Issue 58's pure parts: which files an attempt's write keeps (wherever the warehouse is, a hidden `.cache` folder
included), the rows per batch counted by source coordinates, the one sentence of a difference, and the reland's
commit metadata that the batch audit of a lakehouse table leaves aside."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from microbatch.config import PipelineSpec
from microbatch.phases.audit import mismatch
from microbatch.sinks import iceberg
from microbatch.sinks.audit import count_in_ranges, count_rows_sql, delete_rows_sql, ranges_params
from microbatch.sinks.delta import Owner, commit_metadata, microbatch_meta
from microbatch.sinks.registry import sinks_of
from microbatch.types import OffsetRange


def test_an_attempts_files_are_kept_under_a_hidden_warehouse():
    folder = "/home/me/repo/.cache/warehouse/orders/data/microbatch-3-1"
    written = [f"{folder}/_p0=20418/part-00000-a.c000.snappy.parquet", f"{folder}/part-00001-b.c000.snappy.parquet",
               f"{folder}/_p0=20418/.part-00000-a.c000.snappy.parquet.crc", f"{folder}/_SUCCESS",
               f"{folder}/_temporary/0/part-9.parquet", f"{folder}/.hidden/part-8.parquet"]
    assert iceberg.data_files(folder, written) == written[:2]
    uri = "s3://bucket/.lake/orders/data/microbatch-3-1"
    assert iceberg.data_files(uri, [f"{uri}/part-1.parquet"]) == [f"{uri}/part-1.parquet"]


def test_file_rows_reads_the_footers(tmp_path):
    paths = []
    for i, n in enumerate((3, 0, 5)):
        path = tmp_path / ".cache" / f"part-{i}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"x": list(range(n))}, schema=pa.schema([("x", pa.int64())])), path)
        paths.append(str(path))
    assert iceberg.file_rows(paths) == 8


def test_rows_per_batch_by_coordinates():
    table = pa.table({"topic": ["a", "a", "a", "a", "b"], "partition": pa.array([0, 0, 0, 1, 0], pa.int32()),
                      "offset": pa.array([0, 4, 5, 2, 7], pa.int64())})
    ranges = {1: [OffsetRange("a", 0, 0, 5)], 2: [OffsetRange("a", 0, 5, 9), OffsetRange("a", 1, 0, 4)],
              3: [OffsetRange("c", 0, 0, 9)], 4: [OffsetRange("b", 0, 8, 10)]}
    assert count_in_ranges(table, ranges) == {1: 2, 2: 2, 3: 0, 4: 0}
    assert count_in_ranges(table.slice(0, 0), ranges) == {1: 0, 2: 0, 3: 0, 4: 0}


def test_the_sql_of_rows_in_ranges_binds_arrays_and_names_no_ledger_table():
    params = ranges_params({7: [OffsetRange("t", 1, 10, 20), OffsetRange("t", 2, 0, 5)]})
    assert params == {"b": [7, 7], "t": ["t", "t"], "p": [1, 2], "lo": [10, 0], "hi": [20, 5]}
    for sql in (count_rows_sql('"raw"'), delete_rows_sql('"raw"')):
        assert "unnest(" in sql and "ranges" not in sql and '"raw"' in sql


def spec() -> PipelineSpec:
    columns = {"user": "text", "ts": "timestamptz"}
    return PipelineSpec.model_validate({
        "name": "orders", "source": {"topics": ["t"]}, "job": {"transform": "spark_jobs.clicks:transform"},
        "sinks": [{"name": "raw", "type": "postgres_append", "table": "raw", "columns": columns},
                  {"name": "lake", "type": "delta", "mode": "append", "columns": columns},
                  {"name": "users", "type": "delta", "mode": "upsert", "columns": columns, "keys": ["user"],
                   "order_by": "ts"},
                  {"name": "ice", "type": "iceberg", "table": "orders_lake", "columns": columns}]})


def test_sinks_say_how_their_rows_are_audited():
    audits = {name: sink.row_audit for name, sink in sinks_of(spec()).items()}
    assert audits == {"raw": "coordinates", "lake": "coordinates", "users": None, "ice": "coordinates"}


def test_a_difference_is_one_sentence_naming_pipeline_sink_batch_and_counts():
    sinks = sinks_of(spec())
    text = mismatch("orders", sinks["ice"], 12, 2001, 0)
    assert text == ("rows: pipeline orders, sink ice, batch 12: the ledger committed 2001 rows, the table holds 0; "
                    "`microbatch reland orders ice` lands the batch again")


def test_a_relands_commit_is_not_the_batchs_own():
    owner = Owner("orders", "uid", "lake")
    ranges = [OffsetRange("t", 0, 0, 10)]
    assert microbatch_meta(commit_metadata(owner, 4, 2, ranges))["batch_id"] == 4
    relanded = commit_metadata(owner, 4, 2, ranges, reland=1)
    assert microbatch_meta(relanded) is None
    assert microbatch_meta(relanded, relands=True)["reland"] == 1
