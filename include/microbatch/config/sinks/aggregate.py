"""The `postgres_aggregate` sink model and its event-time window."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from microbatch.column_types import ColumnType
from microbatch.config.columns import SinkModel, _check_columns
from microbatch.config.primitives import _check_identifier, _Strict


class WindowSpec(_Strict):
    """The event-time window columns of an aggregate sink; a window is final once the watermark passes its end."""

    start: str = "window_start"
    end: str = "window_end"

    @field_validator("start", "end")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)


class PostgresAggregateSink(SinkModel):
    """A Postgres table whose numeric columns are summed on conflict of its key columns."""

    type: Literal["postgres_aggregate"] = "postgres_aggregate"
    table: str
    columns: dict[str, ColumnType] | None = None
    """Each column's PostgreSQL type (the keys and the sum columns); with it, `microbatch migrate` creates the
    table, its contributions table and its staging table. Without it, they must exist."""
    keys: list[str] = Field(min_length=1)
    sum_columns: list[str] = Field(min_length=1)
    window: WindowSpec | None = None
    """Set for event-time windowed aggregates: finality (and publishing) follows the watermark."""
    contributions: Literal["per_partition", "per_batch"] = "per_partition"
    """What each commit keeps so that a replay can take its part of the sums back. `per_partition`: the job's
    partial sums per source partition, so a replay can recompute any committed range. `per_batch`: one sum per
    key and batch, as many times fewer rows as the batch has partitions, so the staging write and the commit are
    smaller; a replay then recomputes every partition of each batch it touches, and the job may leave out
    `topic` and `partition` (the stage sums them away). Chosen when the tables are created: `microbatch
    migrate` refuses to change it on an existing sink."""

    @field_validator("name", "table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("keys", "sum_columns")
    @classmethod
    def _identifiers(cls, values: list[str]) -> list[str]:
        return [_check_identifier(v) for v in values]

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        return None if columns is None else _check_columns(columns)

    @model_validator(mode="after")
    def _window_in_keys(self) -> PostgresAggregateSink:
        if self.window and not {self.window.start, self.window.end} <= set(self.keys):
            raise ValueError("window: its start and end columns must be among the keys")
        if self.columns is not None and set(self.columns) != {*self.keys, *self.sum_columns}:
            missing = sorted({*self.keys, *self.sum_columns} - set(self.columns))
            extra = sorted(set(self.columns) - {*self.keys, *self.sum_columns})
            raise ValueError(f"columns: must type exactly the keys and sum columns (missing {missing or 'none'}, "
                             f"not a key or sum column {extra or 'none'})")
        return self

    @property
    def staging_table(self) -> str:
        """The staging table Spark writes to, tagged by (batch_id, attempt)."""
        return f"stage_{self.table}"

    @property
    def contributions_table(self) -> str:
        """Every committed partial aggregate per (batch, topic, partition), or per batch, kept so a replay can
        retract it."""
        return f"{self.table}_contributions"

    @property
    def per_partition(self) -> bool:
        """Staged rows and contributions carry the source `topic` and `partition`."""
        return self.contributions == "per_partition"

    @property
    def key_and_sum_columns(self) -> list[str]:
        return [*self.keys, *self.sum_columns]

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "partials"

    @property
    def query_columns(self) -> list[str]:
        return self.key_and_sum_columns

    @property
    def published_columns(self) -> list[str] | None:
        """A windowed aggregate publishes each final window once."""
        return self.key_and_sum_columns if self.window is not None else None
