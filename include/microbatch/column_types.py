"""The spec's column types: their names (PostgreSQL's spelling), the facts the checks ask of them, and their Spark
spellings (the column type a Spark type becomes; the Spark type `from_json` reads one as, and a sample value, for
the scaffold).

The names are spelled out here and in `microbatch.sinks.column_mappers` (each sink target's types), nowhere else.
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

POSTGRES_FOR_SPARK = {"string": "text", "binary": "bytea", "bigint": "bigint", "int": "integer",
                      "smallint": "smallint", "tinyint": "smallint", "boolean": "boolean", "double": "double precision",
                      "float": "real", "timestamp": "timestamptz", "timestamp_ntz": "timestamp", "date": "date"}
"""A column type to declare for a Spark SQL type, for the examples of the spec's error sentences."""


def spec_type_for_spark(spark: str) -> str:
    """The sink column type of a Spark SQL type: numeric for any decimal."""
    return NUMERIC if spark.startswith("decimal") else POSTGRES_FOR_SPARK[spark]


# The Spark type `from_json` reads each column type as (the scaffold's transform is written with it).
SCAFFOLD_SPARK_TYPES = {
    "text": "StringType()", "bigint": "LongType()", "integer": "IntegerType()", "smallint": "ShortType()",
    "double precision": "DoubleType()", "real": "FloatType()", "numeric": "DecimalType(38, 10)",
    "boolean": "BooleanType()", "timestamptz": "TimestampType()", "timestamp": "TimestampNTZType()",
    "date": "DateType()", "jsonb": "StringType()", "bytea": "BinaryType()", "uuid": "StringType()",
}
SAMPLE_VALUES: dict[str, object] = {
    "text": "x", "bigint": 1, "integer": 1, "smallint": 1, "double precision": 1.5, "real": 1.5, "numeric": 1.5,
    "boolean": True, "timestamptz": "2026-11-25T10:00:00Z", "timestamp": "2026-11-25T10:00:00",
    "date": "2026-11-25", "jsonb": "x", "bytea": "x", "uuid": "00000000-0000-0000-0000-000000000001",
}
"""A value of each column type in the scaffold's unit test (a JSON value that `from_json` reads as it)."""
