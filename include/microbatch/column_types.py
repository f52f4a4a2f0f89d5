"""The spec's column types: their names (PostgreSQL's spelling) and the facts the checks ask of them.

The one place the names are spelled out; each target's spelling is in `microbatch.column_mappers`.
"""

from __future__ import annotations

from typing import Literal, get_args

ColumnType = Literal["text", "bigint", "integer", "smallint", "double precision", "real", "numeric", "boolean",
                     "timestamptz", "timestamp", "date", "jsonb", "bytea", "uuid"]
"""The PostgreSQL types a sink column may have."""

COLUMN_TYPES: tuple[str, ...] = get_args(ColumnType)
"""Every column type of the spec, in the order of `ColumnType`."""

TEXT: ColumnType = "text"
"""The type of a column whose type is not known otherwise."""
NUMERIC: ColumnType = "numeric"
"""The type of any decimal."""
ZONED_TIME: ColumnType = "timestamptz"
"""A point in time (with time zone)."""
LOCAL_TIME: ColumnType = "timestamp"
"""A timestamp without time zone."""
DATE: ColumnType = "date"
"""A calendar day."""

TIME_TYPES = (ZONED_TIME, LOCAL_TIME)
"""The timestamp types (an upsert's `order_by` by record key must be one)."""
CALENDAR_TYPES = (*TIME_TYPES, DATE)
"""The types a partition may take the year, month, day or hour of (the hour only of a timestamp)."""
