"""The `iceberg` sink model: an Apache Iceberg table, append only."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from microbatch.column_types import ColumnType
from microbatch.config.columns import SOURCE_COORDINATES, SinkModel, _check_row_columns
from microbatch.config.primitives import _check_identifier
from microbatch.config.sinks.lake import LakeMaintenance, check_partition_by, partition_columns


class IcebergSink(SinkModel):
    """An Apache Iceberg table, append only, exactly once per batch: Spark's executors write the batch's Parquet
    files and ONE pyiceberg commit adds them, its snapshot summary naming the batch; the catalog is pyiceberg's
    SQL catalog in the ledger's database (docs/sinks.md)."""

    type: Literal["iceberg"]
    namespace: str = "microbatch"
    """The catalog namespace of the table."""
    table: str | None = None
    """The table's name in the catalog. Default: the sink's name."""
    path: str | None = None
    """The table's location, as a Delta sink's `path`: a folder under the warehouse (`MICROBATCH_WAREHOUSE`,
    default `.cache/warehouse`), an absolute path, or a URI such as `s3://bucket/tables/clicks` (pyiceberg's and
    Spark's settings give the credentials). Default: the sink's name under the warehouse."""
    mode: Literal["append"] = "append"
    columns: dict[str, ColumnType] = Field(min_length=1)
    """Each column's type (the PostgreSQL names, mapped to Iceberg's); the table gets `topic`, `partition` and
    `offset` added."""
    partition_by: list[str] = Field(default_factory=list)
    """Columns or transforms `year(c)`, `month(c)`, `day(c)`, `hour(c)` of a timestamp or date column: the
    table's partition spec (Iceberg's hidden partitioning, no extra column)."""
    include_late: bool = True
    """Take records whose window was already final (a landing table takes every valid record)."""
    keep_tombstones: bool = False
    """Keep each tombstone (a key with a null value) as a row: the record's coordinates, the columns named as the
    decoded key's (`key_text`, `key_<field>`), every other column null; by default an append sink skips it
    (docs/formats.md#tombstones)."""
    maintenance: LakeMaintenance = Field(default_factory=LakeMaintenance)

    @field_validator("name", "namespace", "table")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        return None if value is None else _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str]) -> dict[str, str]:
        return _check_row_columns(columns)

    @model_validator(mode="after")
    def _partitions_known(self) -> IcebergSink:
        known = {*self.columns, *SOURCE_COORDINATES}
        check_partition_by(self.partition_by, self.columns, known, hour_of_date=False)
        return self

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows"

    @property
    def query_columns(self) -> list[str]:
        return list(self.columns)

    @property
    def partition_columns(self) -> list[tuple[str, str | None, str]]:
        """(partition field name, transform or None, source column) for each `partition_by` item."""
        return partition_columns(self.partition_by)
