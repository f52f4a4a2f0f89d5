"""What a sink's spec makes of its tables, without a database (the comparison with one is in
tests/integration/test_sink_schema.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from microbatch.config import PipelineSpec, find_spec
from microbatch.errors import SpecError
from microbatch.sinks.base import sql_type
from microbatch.sinks.registry import sinks_of
from microbatch.sinks.schema import required_tables, sink_metadata

IP_COUNT = find_spec("ip_count")


def test_the_aggregate_sink_defines_its_table_staging_and_contributions() -> None:
    metadata = sa.MetaData()
    sinks = sinks_of(IP_COUNT)
    tables = {t.name: t for t in sinks["ip_counts"].tables(metadata)}
    assert list(tables) == ["ip_counts", "stage_ip_counts", "ip_counts_contributions"]
    assert [c.name for c in tables["ip_counts"].primary_key.columns] == ["window_start", "window_end", "ip"]
    assert {i.name for i in tables["ip_counts"].indexes} == {"ix_ip_counts_window_end"}
    assert {i.name: [c.name for c in i.columns] for i in tables["stage_ip_counts"].indexes} == {
        "ix_stage_ip_counts_batch": ["batch_id", "attempt"]}
    # An append-only log: no primary key, an index on batch_id (bench/commit_cost.py --explain).
    assert list(tables["ip_counts_contributions"].primary_key.columns) == []
    assert {i.name: [c.name for c in i.columns] for i in tables["ip_counts_contributions"].indexes} == {
        "ix_ip_counts_contributions": ["batch_id"]}
    assert not any(c.nullable for t in tables.values() for c in t.columns)
    assert sinks["ip_count_sink"].tables(metadata) == []
    assert required_tables(IP_COUNT) == []


def test_without_columns_an_aggregate_defines_no_tables_and_requires_them() -> None:
    raw = IP_COUNT.model_dump(mode="json")
    raw["sinks"][0]["columns"] = None
    spec = PipelineSpec.model_validate(raw)
    assert [t for t in sink_metadata(spec).tables if t != "batches"] == []
    assert required_tables(spec) == ["ip_counts", "stage_ip_counts", "ip_counts_contributions"]


def test_a_table_name_postgres_would_cut_short_is_refused() -> None:
    raw = IP_COUNT.model_dump(mode="json")
    raw["sinks"][0]["table"] = "t" * 60
    with pytest.raises(SpecError, match="longer than Postgres's 63 characters; give the sink a shorter table name"):
        sink_metadata(PipelineSpec.model_validate(raw))


@pytest.mark.parametrize(("name", "rendered"), [
    ("bigint", "BIGINT"), ("double precision", "DOUBLE PRECISION"), ("timestamptz", "TIMESTAMP WITH TIME ZONE"),
    ("timestamp", "TIMESTAMP WITHOUT TIME ZONE"), ("jsonb", "JSONB"), ("uuid", "UUID"), ("bytea", "BYTEA"),
])
def test_sql_type_renders_the_postgres_type(name: str, rendered: str) -> None:
    from sqlalchemy.dialects import postgresql

    assert sql_type(name).compile(dialect=postgresql.dialect()) == rendered
    with pytest.raises(ValueError, match="not a column type"):
        sql_type("money")


def test_a_lakehouse_sink_names_no_postgres_table() -> None:
    # An iceberg sink's documented `table:` is its catalog table's name (issue 58): migrate and the plan must not
    # look for a Postgres table of that name; a delta sink names none either.
    raw = IP_COUNT.model_dump(mode="json")
    raw["sinks"] = [{"name": "orders_lake_sink", "type": "iceberg", "table": "orders_lake",
                     "columns": {"order_id": "text", "amount": "double precision"}},
                    {"name": "orders_delta", "type": "delta", "columns": {"order_id": "text"}}]
    spec = PipelineSpec.model_validate(raw)
    sinks = sinks_of(spec)
    assert [s.table for s in sinks.values()] == [None, None]
    assert all(s.lake_location is not None for s in sinks.values())
    assert required_tables(spec) == []
    assert [t for t in sink_metadata(spec).tables if t != "batches"] == []
