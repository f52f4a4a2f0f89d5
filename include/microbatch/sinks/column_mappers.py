"""The spec's column types (`microbatch.column_types`) in each sink target's spelling: one mapper per target.

Postgres (SQLAlchemy types), Delta (its primitive types), Iceberg (the Spark type its files are written with, and
its own type). SQLAlchemy and pyiceberg are imported only when their mapper is called.
"""

from __future__ import annotations

from functools import cache
from typing import Any


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
