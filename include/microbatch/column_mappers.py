"""The spec's column types (`microbatch.column_types`) in each target's spelling: one table or function per target.

Postgres (SQLAlchemy types), Spark SQL (the spec type of a Spark type, for inference and the spec's examples),
Delta, Iceberg (the Spark type its files are written with, and pyiceberg's type), and the scaffold (Spark type
constructors and a sample value). SQLAlchemy and pyiceberg are imported only when their mapper is called.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from microbatch.column_types import NUMERIC

POSTGRES_FOR_SPARK = {"string": "text", "binary": "bytea", "bigint": "bigint", "int": "integer",
                      "smallint": "smallint", "tinyint": "smallint", "boolean": "boolean", "double": "double precision",
                      "float": "real", "timestamp": "timestamptz", "timestamp_ntz": "timestamp", "date": "date"}
"""A column type to declare for a Spark SQL type, for the examples of the spec's error sentences."""


def spec_type_for_spark(spark: str) -> str:
    """The sink column type of a Spark SQL type: numeric for any decimal."""
    return NUMERIC if spark.startswith("decimal") else POSTGRES_FOR_SPARK[spark]


@cache
def postgres_types() -> dict[str, Any]:
    """The SQLAlchemy type (a callable that makes one) of each spec column type."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql

    return {
        "text": sa.Text,
        "bigint": sa.BigInteger,
        "integer": sa.Integer,
        "smallint": sa.SmallInteger,
        "double precision": postgresql.DOUBLE_PRECISION,
        "real": postgresql.REAL,
        "numeric": sa.Numeric,
        "boolean": sa.Boolean,
        "timestamptz": lambda: postgresql.TIMESTAMP(timezone=True),
        "timestamp": lambda: postgresql.TIMESTAMP(timezone=False),
        "date": sa.Date,
        "jsonb": postgresql.JSONB,
        "bytea": postgresql.BYTEA,
        "uuid": postgresql.UUID,
    }


# The spec's column types (PostgreSQL names) as Delta's primitive types.
DELTA_TYPES = {
    "text": "string", "bigint": "long", "integer": "integer", "smallint": "short", "double precision": "double",
    "real": "float", "numeric": "decimal(38,9)", "boolean": "boolean", "timestamptz": "timestamp",
    "timestamp": "timestamp_ntz", "date": "date", "jsonb": "string", "bytea": "binary", "uuid": "string",
}

# The spec's column types (PostgreSQL names) as the Spark type the files are written with, and Iceberg's type.
ICEBERG_SPARK_TYPES = {
    "text": "string", "bigint": "bigint", "integer": "int", "smallint": "int", "double precision": "double",
    "real": "float", "numeric": "decimal(38,9)", "boolean": "boolean", "timestamptz": "timestamp",
    "timestamp": "timestamp_ntz", "date": "date", "jsonb": "string", "bytea": "binary", "uuid": "string",
}
ICEBERG_TYPES = {
    "text": "string", "bigint": "long", "integer": "int", "smallint": "int", "double precision": "double",
    "real": "float", "numeric": "decimal(38, 9)", "boolean": "boolean", "timestamptz": "timestamptz",
    "timestamp": "timestamp", "date": "date", "jsonb": "string", "bytea": "binary", "uuid": "string",
}


def iceberg_type(spec_type: str) -> Any:
    """The pyiceberg type of a spec column type."""
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
        TimestamptzType,
    )

    return {"string": StringType(), "long": LongType(), "int": IntegerType(), "double": DoubleType(),
            "float": FloatType(), "decimal(38, 9)": DecimalType(38, 9), "boolean": BooleanType(),
            "timestamptz": TimestamptzType(), "timestamp": TimestampType(), "date": DateType(),
            "binary": BinaryType()}[ICEBERG_TYPES[spec_type]]


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
