"""`microbatch new NAME --from-topic TOPIC`: the pipeline a sample of the live topic gives
(`microbatch.kafka.sampling`).

The inference is pure: sampled bytes in, spec out. For each side (key, value) the formats of
`formats.registry.FORMATS` are asked in the order of `Format.guess_rank` whether the sample looks like them (avro in
the Confluent wire format, JSON objects, UTF-8 text, else raw; no format for a side that is always null); the first
that does infers the side's spec and columns (`formats/inference.py`). One `postgres_append` sink named NAME stores
those columns (made unique, typed for PostgreSQL) and its `sql` selects them from `records`. A change stream's value
(a format whose `change_stream` is true: debezium) has its key read by the same format, the primary key, and wants a
`postgres_upsert` sink instead (`SampledSide.upsert`): keyed by the key's fields, storing the value's columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from microbatch.column_types import spec_type_for_spark
from microbatch.config import SOURCE_COORDINATES
from microbatch.errors import SpecError
from microbatch.formats.base import Format
from microbatch.formats.inference import Sample, Upsert, quote_sql, unique
from microbatch.formats.registry import FORMATS

GUESSED = sorted(FORMATS.values(), key=lambda fmt: fmt.guess_rank)
"""The formats in the order a sample is held against them."""


@dataclass(frozen=True)
class SinkColumn:
    """One column of the inferred sink: its name and PostgreSQL type, the Spark SQL expression over `records` that
    gives it, and where it comes from (for the summary)."""

    name: str
    type: str
    expression: str
    origin: str


@dataclass(frozen=True)
class Side:
    """What the sample says of a record's key or value: its format (`spec`, None for raw), the columns it gives
    the sink, and one line for the summary."""

    format: str
    spec: dict[str, Any] | None
    columns: tuple[SinkColumn, ...]
    summary: str
    notes: tuple[str, ...] = ()
    """One line per field the summary says more of (an epoch time declared a timestamp)."""
    upsert: Upsert | None = None
    """A change stream's value: the upsert sink it wants."""
    keys: tuple[str, ...] = ()
    """A change stream's key: the value's columns (by their decoded names) that are the primary key."""


@dataclass(frozen=True)
class Inference:
    """The pipeline inferred from `sampled` records: the spec (a dict, as YAML writes it) and the summary lines."""

    spec: dict[str, Any]
    sampled: int
    key: Side
    value: Side
    stored: tuple[SinkColumn, ...] = ()
    """The sink's columns (the key's and the value's; a change stream's value's alone)."""
    notes: tuple[str, ...] = ()
    """What the summary says of the sink."""

    @property
    def sink_columns(self) -> dict[str, str]:
        return {c.name: c.type for c in self.stored}

    @property
    def selected_only(self) -> tuple[str, ...]:
        """The columns the sink's `sql` selects beside its stored ones (an upsert's `delete_column`)."""
        delete = self.spec["sinks"][0].get("delete_column")
        return (delete,) if delete else ()

    def summary(self, topic: str) -> list[str]:
        lines = [f"sampled {self.sampled} record(s) of {topic} from the earliest offsets",
                 f"value: {self.value.summary}", f"key: {self.key.summary}"]
        width = max((len(c.origin) for c in self.stored), default=0)
        lines += [f"  {c.origin:<{width}}  ->  {c.name} {c.type}" for c in self.stored]
        return [*lines, *self.key.notes, *self.value.notes, *self.notes]


def postgres_type(spark: str) -> str:
    """The sink column type of a Spark SQL type: numeric for any decimal."""
    return spec_type_for_spark(spark)


def guessed(sample: Sample) -> type[Format]:
    """The first format of `GUESSED` the sample looks like (raw, last, takes any)."""
    return next(fmt for fmt in GUESSED if fmt.looks_like(sample))


def infer_side(side: str, datas: list[bytes | None], records: set[str], sink: set[str],
               avro_schema: Callable[[], str | None] | None = None, now: datetime | None = None,
               change_stream: bool = False) -> Side:
    """The format of a record's `side` ("key" or "value") from its sampled bytes: the Confluent wire format (every
    non-null one starts with the magic byte 0 and a schema id) -> avro, its fields those of the subject's latest
    schema (`avro_schema`, None when no registry is configured or it has no such subject); JSON objects (every
    non-null one) -> json, fields typed across the sample and `required` where every object has them non-null; else
    text where all are UTF-8; else raw. All null -> raw with no column. `records` and `sink`: the decoded columns
    and the sink's columns named so far; the ones named here are added. `now` (default: the current time): what
    an epoch time must be near (`epoch_unit`). `change_stream`: the key of a change stream's value, which the
    value's format reads (`Format.change_stream`)."""
    sample = Sample(side, datas, records, now or datetime.now(UTC), avro_schema, change_stream)
    sampled = guessed(sample).infer(sample)
    columns = tuple(SinkColumn(unique(c.name[:63], sink), postgres_type(c.spark), c.expression, c.origin)
                    for c in sampled.columns)
    return Side(sampled.format, sampled.spec, columns, sampled.summary, sampled.notes, sampled.upsert,
                sampled.keys)


def upsert_keys(key: Side, value: Side) -> list[str] | None:
    """The sink columns of a change stream's primary key: the value's columns the key names; None when the key
    names none (a table without a primary key) or one the value does not have."""
    by_decoded = {c.expression: c.name for c in value.columns}
    keys = [by_decoded.get(quote_sql(name)) for name in key.keys]
    return [k for k in keys if k is not None] if keys and None not in keys else None


def infer_pipeline(name: str, topic: str, keys: list[bytes | None], values: list[bytes | None],
                   avro_schema: Callable[[str], str | None] | None = None, now: datetime | None = None,
                   ) -> Inference:
    """The YAML-only pipeline of the sampled records' keys and values: the source's formats and one
    `postgres_append` sink named `name` whose columns are the decoded ones (flattened, see
    `formats.json_inference.flatten`) and whose `sql` selects them from `records`; for a change stream whose key
    names its primary key, one `postgres_upsert` sink of the value's columns instead, keyed by it. `avro_schema`:
    the latest schema of a registry subject, or None. `now` (default: the current time, taken once): what an epoch
    time must be near (`epoch_unit`)."""
    now = now or datetime.now(UTC)
    records: set[str] = set()
    sink: set[str] = set(SOURCE_COORDINATES)

    def latest(side: str) -> Callable[[], str | None] | None:
        return None if avro_schema is None else lambda: avro_schema(f"{topic}-{side}")

    change_stream = guessed(Sample("value", values, set(), now, latest("value"))).change_stream
    key = infer_side("key", keys, records, sink, latest("key"), now, change_stream)
    value = infer_side("value", values, records, sink, latest("value"), now)
    columns = [*key.columns, *value.columns]
    primary_key = upsert_keys(key, value) if value.upsert is not None else None
    upsert = value.upsert if primary_key is not None else None
    notes: tuple[str, ...] = ()
    if value.upsert is not None and upsert is None:
        notes = (f"the key of {topic} names no primary key column of its values (a table without a primary key?): "
                 "the changes are appended, one row each, not applied",)
    if upsert is not None:
        columns = list(value.columns)
    if not columns:
        raise SpecError(f"Every sampled record of {topic} has a null key and a null value, so there is nothing to "
                        "infer.", fix="Produce a few records with values first, or describe them with --topic "
                        "--format --columns.")
    selected = [(c.expression, c.name) for c in columns]
    if upsert is not None:
        selected.append((quote_sql(upsert.delete_column), upsert.delete_column))
    select = ",\n       ".join(expression if expression == quote_sql(name) else
                               f"{expression} AS {quote_sql(name)}" for expression, name in selected)
    source: dict[str, Any] = {"topics": [topic], "startup": "earliest", "max_records_per_batch": 100000}
    if key.spec is not None:
        source["key"] = key.spec
    if value.spec is not None:
        source["value"] = value.spec
    sink_spec: dict[str, Any] = {"name": name, "type": "postgres_append", "table": name,
                                 "columns": {c.name: c.type for c in columns}}
    description = f"Records of {topic} ({value.format} value, {key.format} key), one row each."
    if upsert is not None:
        description = f"Changes of {topic} ({value.format} value and key) applied, one row a primary key."
        sink_spec = {**sink_spec, "type": "postgres_upsert", "keys": primary_key, "order_by": upsert.order_by,
                     "delete_column": upsert.delete_column,
                     **({"unavailable_value": upsert.unavailable_value} if upsert.unavailable_value else {})}
    spec = {
        "name": name,
        "description": description,
        "schedule": "1m",
        "source": source,
        "sinks": [{**sink_spec, "sql": f"SELECT {select}\nFROM records\n"}],
        "retries": {"count": 3, "delay_seconds": 10},
        "spark": {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "2"}},
    }
    return Inference(spec=spec, sampled=len(values), key=key, value=value, stored=tuple(columns), notes=notes)
