"""What a format infers from a sample of a topic's keys or values (`microbatch new --from-topic`).

The scaffold asks each format of `formats.registry.FORMATS`, in the order of `Format.guess_rank`, whether a
`Sample` of one side looks like it (`Format.looks_like`); the first that says yes infers the side
(`Format.infer`): a `SampledSide`, the spec of `source.key` or `source.value` and the `SampledColumn`s a sink can
store. This module also holds the naming the formats share: snake_case names, the names a decoded column may not
take, unique names, and Spark SQL quoting.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlglot
from sqlglot import exp

from microbatch.transform import ERROR_COLUMN, EVENT_TIME_COLUMN, HEADERS_COLUMN, LATE_COLUMN, RECORD_COLUMNS

INFER_RESERVED = (*RECORD_COLUMNS, HEADERS_COLUMN, ERROR_COLUMN, LATE_COLUMN, EVENT_TIME_COLUMN)
"""Names a decoded column may not take (the record's columns and the job contract's): the field is read with
`from` into `payload_<name>`."""
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A name Spark SQL may read without backticks (if it is no keyword), and a struct's field name."""


@dataclass
class Sample:
    """The sampled bytes of one side ("key" or "value") of a topic's records. `records`: the decoded columns named
    so far (a format adds the ones it names); `now`: what an epoch time must be near; `latest_schema`: the latest
    registry schema of the side's subject (None when no registry is configured)."""

    side: str
    datas: list[bytes | None]
    records: set[str]
    now: datetime
    latest_schema: Callable[[], str | None] | None = None
    change_stream: bool = False
    """The key side of a topic whose values are a change stream (`Format.change_stream`): the key is the changed
    row's primary key, read by the value's format."""
    present: list[bytes] = field(init=False)
    """The non-null ones."""

    def __post_init__(self) -> None:
        self.present = [d for d in self.datas if d is not None]


@dataclass(frozen=True)
class SampledColumn:
    """One value a sink can store as a column: the `name` it asks for (the sink makes it unique), its Spark SQL
    type (`string` for a value kept as its JSON text), the Spark SQL `expression` over `records` that reads it, and
    where it comes from (for the summary)."""

    name: str
    spark: str
    expression: str
    origin: str


@dataclass(frozen=True)
class Upsert:
    """The `postgres_upsert` sink a change stream's value wants, keyed by its key side's `SampledSide.keys`: the
    column that orders a key's changes, the one that says a change deletes its key (selected, not stored), and the
    placeholder of a value the change left out."""

    order_by: str
    delete_column: str
    unavailable_value: str | None = None


@dataclass(frozen=True)
class SampledSide:
    """What a format infers from a sample: its `format` name, the side's `spec` (None for raw), the columns it
    gives a sink, one line for the summary, and one per field the summary says more of. A change stream's value
    names the sink it wants (`upsert`), its key the value's columns that are the primary key (`keys`)."""

    format: str
    spec: dict[str, Any] | None
    columns: tuple[SampledColumn, ...]
    summary: str
    notes: tuple[str, ...] = ()
    upsert: Upsert | None = None
    keys: tuple[str, ...] = ()


def snake_case(name: str) -> str:
    """A lower-case SQL identifier for any JSON name: `userId` -> user_id, `user-id` -> user_id, `2fa` -> _2fa."""
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()
    text = re.sub(r"[^a-z0-9]+", "_", text).strip("_") or "field"
    return (f"_{text}" if text[0].isdigit() else text)[:48]


def unique(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`, ... the first not in `taken`; added to `taken`."""
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def quote_sql(name: str) -> str:
    """`name` as a Spark SQL identifier: as it is where it parses as a column of that name, else in backticks."""
    if IDENTIFIER.fullmatch(name):
        try:
            parsed = sqlglot.parse_one(f"SELECT {name} FROM records", read="spark")
        except sqlglot.errors.ParseError:
            parsed = None
        selected = parsed.expressions[0] if isinstance(parsed, exp.Select) else None
        if isinstance(selected, exp.Column) and not selected.table and selected.name == name:
            return name
    return "`" + name.replace("`", "``") + "`"
