"""The row sink models: `postgres_append` and `postgres_upsert`, on their shared `_RowSink` base."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from microbatch.column_types import ColumnType
from microbatch.config.columns import (
    KEYS_FROM,
    SinkModel,
    _check_keys_given,
    _check_row_columns,
    _check_upsert_columns,
)
from microbatch.config.primitives import _check_identifier


class _RowSink(SinkModel):
    """A Postgres table of rows (not sums): each row keeps the source coordinates of the record it came from."""

    table: str
    columns: dict[str, ColumnType] = Field(min_length=1)
    """Each column's PostgreSQL type, in table order; `microbatch migrate` creates the table from it, with the
    source coordinates `topic`, `partition` and `offset` added."""
    include_late: bool = True
    """Take records whose event-time window was already final (a raw landing table takes every valid record);
    false: they go to `late_records` as for an aggregate."""

    @field_validator("name", "table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str]) -> dict[str, str]:
        return _check_row_columns(columns)

    @property
    def staging_table(self) -> str:
        return f"stage_{self.table}"

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows"

    @property
    def query_columns(self) -> list[str]:
        delete = getattr(self, "delete_column", None)
        return [*self.columns, *([delete] if delete else [])]


class PostgresAppendSink(_RowSink):
    """Every output row inserted once, with its source topic, partition and offset; a replay replaces the rows
    of the ranges it recomputes."""

    type: Literal["postgres_append"]
    keep_tombstones: bool = False
    """Keep each tombstone (a key with a null value) as a row: the record's coordinates, the columns named as the
    decoded key's (`key_text`, `key_<field>`), every other column null; by default an append sink skips it
    (docs/formats.md#tombstones)."""

    @property
    def published_columns(self) -> list[str] | None:
        """Each row is published once."""
        return list(self.columns)


class PostgresUpsertSink(_RowSink):
    """The last value per key: the greatest (`order_by`, then topic, partition, offset) among all committed
    records; a record whose `delete_column` is true, or whose non-key columns are all null, removes the key."""

    type: Literal["postgres_upsert"]
    keys_from: KEYS_FROM = "columns"
    """`record_key`: the table is keyed by the record key's columns, and a tombstone deletes its key."""
    keys: list[str] = Field(default_factory=list)
    """The key columns (with `keys_from: record_key`, the record key's columns, filled in by the pipeline)."""
    order_by: str | None = None
    """A column that orders the versions of a key before the source coordinates (e.g. an event time)."""
    delete_column: str | None = None
    """A boolean output column (not stored) that marks a record as a delete of its key: a tombstone."""
    unavailable_value: str | None = None
    """A text that stands for an unchanged value, not a value: change data capture's placeholder of an unchanged
    TOASTed column (Debezium's `__debezium_unavailable_value`). A text column holding it keeps the key's latest real
    value; a row whose full value was never seen is held (absent) until one arrives (docs/cdc.md)."""

    @model_validator(mode="after")
    def _columns_known(self) -> PostgresUpsertSink:
        _check_keys_given(self.keys_from, self.keys)
        if self.unavailable_value is not None and not (self.order_by and self.delete_column):
            raise ValueError("unavailable_value applies a change stream: give it order_by (the change's position in "
                             "the source's log, e.g. __lsn) and delete_column (e.g. __deleted) too")
        if self.keys_from == "columns":
            _check_upsert_columns(self.keys, self.order_by, self.delete_column, self.columns, known=set(self.columns))
        return self
