"""`microbatch new NAME --from-topic TOPIC`: the pipeline a sample of the live topic gives
(`microbatch.kafka.sampling`).

The inference is pure: sampled bytes in, spec out. For each side (key, value) the formats of
`formats.registry.FORMATS` are asked in the order of `Format.guess_rank` whether the sample looks like them (avro in
the Confluent wire format, JSON objects, UTF-8 text, else raw; no format for a side that is always null); the first
that does infers the side's spec and columns (`formats/inference.py`). One `postgres_append` sink named NAME stores
those columns (made unique, typed for PostgreSQL) and its `sql` selects them from `records`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from microbatch.column_types import spec_type_for_spark
from microbatch.config import SOURCE_COORDINATES
from microbatch.errors import SpecError
from microbatch.formats.inference import Sample, quote_sql, unique
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


@dataclass(frozen=True)
class Inference:
    """The pipeline inferred from `sampled` records: the spec (a dict, as YAML writes it) and the summary lines."""

    spec: dict[str, Any]
    sampled: int
    key: Side
    value: Side

    @property
    def sink_columns(self) -> dict[str, str]:
        return {c.name: c.type for c in (*self.key.columns, *self.value.columns)}

    def summary(self, topic: str) -> list[str]:
        lines = [f"sampled {self.sampled} record(s) of {topic} from the earliest offsets",
                 f"value: {self.value.summary}", f"key: {self.key.summary}"]
        width = max((len(c.origin) for c in (*self.key.columns, *self.value.columns)), default=0)
        lines += [f"  {c.origin:<{width}}  ->  {c.name} {c.type}" for c in (*self.key.columns, *self.value.columns)]
        return [*lines, *self.key.notes, *self.value.notes]


def postgres_type(spark: str) -> str:
    """The sink column type of a Spark SQL type: numeric for any decimal."""
    return spec_type_for_spark(spark)


def infer_side(side: str, datas: list[bytes | None], records: set[str], sink: set[str],
               avro_schema: Callable[[], str | None] | None = None, now: datetime | None = None) -> Side:
    """The format of a record's `side` ("key" or "value") from its sampled bytes: the Confluent wire format (every
    non-null one starts with the magic byte 0 and a schema id) -> avro, its fields those of the subject's latest
    schema (`avro_schema`, None when no registry is configured or it has no such subject); JSON objects (every
    non-null one) -> json, fields typed across the sample and `required` where every object has them non-null; else
    text where all are UTF-8; else raw. All null -> raw with no column. `records` and `sink`: the decoded columns
    and the sink's columns named so far; the ones named here are added. `now` (default: the current time): what
    an epoch time must be near (`epoch_unit`)."""
    sample = Sample(side, datas, records, now or datetime.now(UTC), avro_schema)
    fmt = next(fmt for fmt in GUESSED if fmt.looks_like(sample))
    sampled = fmt.infer(sample)
    columns = tuple(SinkColumn(unique(c.name[:63], sink), postgres_type(c.spark), c.expression, c.origin)
                    for c in sampled.columns)
    return Side(sampled.format, sampled.spec, columns, sampled.summary, sampled.notes)


def infer_pipeline(name: str, topic: str, keys: list[bytes | None], values: list[bytes | None],
                   avro_schema: Callable[[str], str | None] | None = None, now: datetime | None = None,
                   ) -> Inference:
    """The YAML-only pipeline of the sampled records' keys and values: the source's formats and one
    `postgres_append` sink named `name` whose columns are the decoded ones (flattened, see
    `formats.json_inference.flatten`) and whose `sql` selects them from `records`. `avro_schema`: the latest schema
    of a registry subject, or None. `now` (default: the current time, taken once): what an epoch time must be near
    (`epoch_unit`)."""
    now = now or datetime.now(UTC)
    records: set[str] = set()
    sink: set[str] = set(SOURCE_COORDINATES)

    def latest(side: str) -> Callable[[], str | None] | None:
        return None if avro_schema is None else lambda: avro_schema(f"{topic}-{side}")

    key = infer_side("key", keys, records, sink, latest("key"), now)
    value = infer_side("value", values, records, sink, latest("value"), now)
    columns = [*key.columns, *value.columns]
    if not columns:
        raise SpecError(f"Every sampled record of {topic} has a null key and a null value, so there is nothing to "
                        "infer.", fix="Produce a few records with values first, or describe them with --topic "
                        "--format --columns.")
    select = ",\n       ".join(c.expression if c.expression == quote_sql(c.name) else
                               f"{c.expression} AS {quote_sql(c.name)}" for c in columns)
    source: dict[str, Any] = {"topics": [topic], "startup": "earliest", "max_records_per_batch": 100000}
    if key.spec is not None:
        source["key"] = key.spec
    if value.spec is not None:
        source["value"] = value.spec
    spec = {
        "name": name,
        "description": f"Records of {topic} ({value.format} value, {key.format} key), one row each.",
        "schedule": "1m",
        "source": source,
        "sinks": [{"name": name, "type": "postgres_append", "table": name,
                   "columns": {c.name: c.type for c in columns},
                   "sql": f"SELECT {select}\nFROM records\n"}],
        "retries": {"count": 3, "delay_seconds": 10},
        "spark": {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "2"}},
    }
    return Inference(spec=spec, sampled=len(values), key=key, value=value)
