"""The `delta` sink model: a Delta Lake table, append or upsert."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from microbatch.column_types import ColumnType
from microbatch.config.columns import (
    KEYS_FROM,
    SOURCE_COORDINATES,
    SinkModel,
    _check_keys_given,
    _check_row_columns,
    _check_upsert_columns,
)
from microbatch.config.primitives import _check_identifier
from microbatch.config.sinks.lake import LakeMaintenance, check_partition_by, partition_columns


class DeltaSink(SinkModel):
    """A Delta Lake table written by Spark's executors, exactly once per batch: each batch is ONE Delta commit
    carrying the batch's idempotency key (`txnAppId`) and its ranges (`userMetadata`); the ledger keeps which
    table version holds which batch. (Its Iceberg counterpart is the `iceberg` sink: see docs/sinks.md.)"""

    type: Literal["delta"]
    path: str | None = None
    """The table's location: a folder under the warehouse (`MICROBATCH_WAREHOUSE`, default `.cache/warehouse`),
    an absolute path, or a URI such as `s3a://bucket/tables/clicks` (Spark's Hadoop settings give the
    credentials). Default: the sink's name under the warehouse."""
    mode: Literal["append", "upsert"] = "append"
    columns: dict[str, ColumnType] = Field(min_length=1)
    """Each column's type (the PostgreSQL names, mapped to Spark's); the table gets `topic`, `partition` and
    `offset` added."""
    partition_by: list[str] = Field(default_factory=list)
    """Columns or transforms `year(c)`, `month(c)`, `day(c)`, `hour(c)` of a timestamp column (a generated
    column `c_day` etc.)."""
    include_late: bool = True
    """Append mode: take records whose window was already final (a landing table takes every valid record)."""
    keep_tombstones: bool = False
    """Append mode: keep each tombstone (a key with a null value) as a row: the record's coordinates, the columns
    named as the decoded key's (`key_text`, `key_<field>`), every other column null; by default an append sink skips
    it (docs/formats.md#tombstones)."""
    keys_from: KEYS_FROM = "columns"
    """Upsert mode: `record_key` keys the table by the record key's columns, and a tombstone deletes its key."""
    keys: list[str] = Field(default_factory=list)
    """Upsert mode: the key columns (required, unless `keys_from: record_key`)."""
    order_by: str | None = None
    """Upsert mode: a column ordering the versions of a key before the source coordinates."""
    delete_column: str | None = None
    """Upsert mode: a boolean output column (not stored) marking a record as a delete of its key; a record whose
    value columns are all null deletes it too. The table keeps a deleted key's row with `_deleted` true."""
    snapshot_partitions: int = Field(default=4, ge=1)
    """Spark tasks that read the table's log into its snapshot at each batch's commit and at maintenance (Delta's
    `spark.databricks.delta.snapshotPartitions`). Delta's default, 50, suits tables of very many files and made
    each small batch's commit wait for 50 tiny tasks: 5.7 s against 1.4 s per commit with 4 in local mode
    (bench/delta_commit.py, docs/performance.md). Raise it for a table whose log holds very many files."""
    maintenance: LakeMaintenance = Field(default_factory=LakeMaintenance)

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str]) -> dict[str, str]:
        return _check_row_columns(columns)

    @model_validator(mode="after")
    def _fits_the_mode(self) -> DeltaSink:
        if self.mode == "upsert":
            _check_keys_given(self.keys_from, self.keys)
        if self.mode == "append" and (self.keys or self.order_by or self.delete_column or self.keys_from != "columns"):
            raise ValueError("keys: only an upsert table has keys, keys_from, order_by or delete_column; set mode: "
                             "upsert")
        if "_deleted" in self.columns:
            raise ValueError("columns: '_deleted' is the upsert table's tombstone flag; rename the column")
        if self.mode == "upsert" and self.keep_tombstones:
            raise ValueError("keep_tombstones: an upsert table applies a tombstone as the delete of its key; keep them "
                             "as rows in an append table (mode: append)")
        known = {*self.columns, *SOURCE_COORDINATES}
        if self.keys_from == "columns":
            _check_upsert_columns(self.keys, self.order_by, self.delete_column, self.columns, known=known)
        check_partition_by(self.partition_by, self.columns, known, hour_of_date=True)
        return self

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows"

    @property
    def query_columns(self) -> list[str]:
        return [*self.columns, *([self.delete_column] if self.delete_column else [])]

    @property
    def partition_columns(self) -> list[tuple[str, str | None, str]]:
        """(table column, transform or None, source column) for each `partition_by` item."""
        return partition_columns(self.partition_by)
