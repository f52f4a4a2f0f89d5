"""A format's declared fields (`json`, `avro`), one model and one set of name checks for every format that declares
them: each field a Spark SQL type and the name it has in the payload (`from`), each column name one Spark and
Postgres both take, no record column's name, no two names that differ only in case.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from microbatch.formats.base import FormatSpec
from microbatch.formats.sql_types import KNOWN_TYPES, SqlType, parse_type
from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import Column

RESERVED_NAMES = (*RECORD_COLUMNS, HEADERS_COLUMN)
EPOCH_TYPES = ("timestamp", "timestamp_ntz")
PATTERN_TYPES = ("timestamp", "timestamp_ntz", "date")
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
EPOCH_BOUNDS = {"s": 253_402_300_799, "ms": 253_402_300_799_999, "us": 253_402_300_799_999_999}
"""The greatest epoch number of each unit that is still a time of year 9999 (Spark's and Postgres's last year);
a number beyond it (or below its negative) is not a timestamp."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class DeclaredField(BaseModel):
    """One declared field: `name: type`, or `name: {type: T, from: payload_name}` to read the payload's field of
    another name. A format's subclass names the type its payload cannot hold (`refused`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type: str
    source_name: str | None = Field(default=None, alias="from")
    """The field's name in the payload, when it differs from the column's name."""
    unit: Literal["s", "ms", "us"] | None = None
    """A timestamp read from an epoch number (an integer, or a string of its digits): seconds, milliseconds or
    microseconds since 1970-01-01 UTC, as Kafka's timestamps, Debezium's `ts_ms` and most producers write a time."""
    format: str | None = None
    """A timestamp or date read from a string in this Spark datetime pattern (e.g. `dd/MM/yyyy HH:mm:ss`) instead of
    ISO-8601."""
    refused: ClassVar[tuple[str, str] | None] = None
    """(a type name the format cannot decode into, at any depth; the sentence that says what to declare instead)."""

    @field_validator("type")
    @classmethod
    def _spark_type(cls, text: str) -> str:
        try:
            parsed = parse_type(text)
        except ValueError as exc:
            raise ValueError(f"{exc}; use one of {KNOWN_TYPES}") from None
        if cls.refused is not None and cls.refused[0] in str(parsed):
            raise ValueError(cls.refused[1])
        return str(parsed)

    @model_validator(mode="after")
    def _time_reading(self) -> DeclaredField:
        if self.unit is not None and self.format is not None:
            raise ValueError("give a timestamp either a unit (an epoch number) or a format (a string), not both")
        if self.unit is not None and self.type not in EPOCH_TYPES:
            raise ValueError(f"unit reads an epoch number into a timestamp; the field is {self.type}: declare it "
                             f"`{{type: timestamp, unit: {self.unit}}}`, or drop unit")
        if self.format is not None:
            if self.type not in PATTERN_TYPES:
                raise ValueError(f"format reads a time string into a timestamp or date; the field is {self.type}: "
                                 "declare it as timestamp, timestamp_ntz or date, or drop format")
            if not self.format.strip() or {"\t", "\n"} & set(self.format):
                raise ValueError("format must be a Spark datetime pattern on one line, e.g. \"dd/MM/yyyy HH:mm:ss\"")
        return self

    @property
    def sql_type(self) -> SqlType:
        return parse_type(self.type)

    @property
    def converts(self) -> bool:
        """The payload's field is read as text and converted (`unit` or `format`), not cast."""
        return self.unit is not None or self.format is not None

    @property
    def described(self) -> str:
        """The declared type as a reason names it: `timestamp`, `timestamp in epoch milliseconds`, `timestamp in
        the format 'dd/MM/yyyy'`."""
        if self.unit is not None:
            return f"{self.type} in epoch {UNIT_NAMES[self.unit]}"
        if self.format is not None:
            return f"{self.type} in the format '{self.format}'"
        return self.type

    @property
    def article(self) -> str:
        return "an" if self.described[0] in "aeiou" else "a"

    def read_from(self, column: str) -> str:
        """The payload's name of the field declared as `column`."""
        return self.source_name or column


class DeclaringSpec(FormatSpec):
    """The spec of a format that declares its fields (`fields: {name: type | {type, from}}`): a subclass narrows
    `fields` to its own field model and names its payload (`payload`, for the name checks' sentences)."""

    fields: dict[str, DeclaredField] = Field(default_factory=dict, validate_default=True)
    payload: ClassVar[str] = ""

    @field_validator("fields", mode="before")
    @classmethod
    def _short_form(cls, fields: Any) -> Any:
        if isinstance(fields, dict):
            return {name: {"type": kind} if isinstance(kind, str) else kind for name, kind in fields.items()}
        return fields

    @field_validator("fields")
    @classmethod
    def _names(cls, fields: dict[str, DeclaredField]) -> dict[str, DeclaredField]:
        check_field_names({name: field.type for name, field in fields.items()}, cls.payload)
        return fields


def check_field_names(types: dict[str, str], kind: str) -> None:
    """Refuse (ValueError, one sentence) a declared column name that is not a name, is a record column's, or
    differs from another only in case; `types` maps each declared name to its type, `kind` names the payload
    ("JSON", "Avro") in the suggestion to read the field under another name with `from`."""
    if not types:
        raise ValueError("declare at least one field as `name: spark_sql_type`, e.g. `payment_id: string`")
    seen: dict[str, str] = {}
    for name, kind_of in types.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"'{name}' is not a column name (letters, digits and _, not starting with a digit, "
                             f"at most 63); name the column so and read the {kind} name with `from`, e.g. "
                             f"`{_suggest(name)}: {{type: {kind_of}, from: \"{name}\"}}`")
        if name.lower() in RESERVED_NAMES:
            raise ValueError(f"'{name}' is the name of a record column; rename the decoded column and read the "
                             f"{kind} field with `from`, e.g. `payload_{name.lower()}: {{type: {kind_of}, "
                             f"from: {name}}}`")
        if name.lower() in seen:
            raise ValueError(f"'{seen[name.lower()]}' and '{name}' differ only in case, which Spark's column "
                             "names do not tell apart; rename one and read its name with `from`")
        seen[name.lower()] = name


def _suggest(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "field"
    return f"_{cleaned}" if cleaned[0].isdigit() else cleaned


def converted(field: DeclaredField, text: Column) -> Column:
    """The declared field's column from `text`, the payload's value as text: an epoch number of `unit` (digits
    only, within `EPOCH_BOUNDS`), a string in `format`, else Spark's cast of the text; null where it is none."""
    from pyspark.sql import functions as F

    if field.unit is not None:
        bound = EPOCH_BOUNDS[field.unit]
        number = F.when(text.rlike(r"^-?[0-9]{1,19}$"), text.try_cast("bigint"))
        number = F.when((number <= F.lit(bound)) & (number >= F.lit(-bound)), number)
        epoch = {"s": F.timestamp_seconds, "ms": F.timestamp_millis, "us": F.timestamp_micros}[field.unit]
        return epoch(number).cast(field.type)
    if field.format is not None:
        return F.try_to_timestamp(text, F.lit(field.format)).cast(field.type)
    return text.try_cast(field.type)
