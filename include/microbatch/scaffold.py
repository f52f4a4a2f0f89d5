"""`microbatch new`: a pipeline that runs as generated.

It writes four files under the repository root: the spec (`include/pipelines/NAME.yaml`, one
`postgres_append` sink named NAME), the transform (`spark_jobs/NAME.py`, the contract of
`microbatch.transform`), its unit test (`tests/unit/test_NAME.py`, a local-Spark test of the transform)
and the thin DAG file (`dags/NAME.py`). A JSON pipeline parses each record as a JSON object into the
declared columns; a text pipeline stores each record as one `line`.

`microbatch new NAME --from-topic TOPIC` writes a YAML-only pipeline instead (the spec, a unit test of the spec
without Spark, and the DAG file; no transform), inferred from up to 100 records of the live topic
(`microbatch.kafka.sampling`) by the pure `infer_pipeline`: the value's and the key's format (`json` when every
non-null one is a JSON object, with Spark SQL types merged across the sample and `required` for the fields every
object has non-null; else `text` when all are UTF-8; else `raw`; no format for a key that is always null), and one
`postgres_append` sink named NAME whose `sql` selects every decoded column. A nested object is declared a struct
and flattened into one column per leaf (`customer['address']['city'] AS customer_address_city`); an array, an object
whose names are no identifiers (a map) and a field whose kinds do not mix (a variant) are stored as their JSON text.
A name that is no lower-case SQL identifier, or that a record column or the job contract takes, becomes a snake_case
column read with `from` (`userId` -> `user_id`, `timestamp` -> `payload_timestamp`). A top-level field whose
sampled values are all integers (or strings of digits) near now in one unit of epoch time is declared a timestamp
read from it (`{type: timestamp, unit: ms}`, `s` or `us`; see `epoch_unit`), and the summary says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import sqlglot
import yaml
from sqlglot import exp

from microbatch.config import POSTGRES_FOR_SPARK, SOURCE_COORDINATES, ColumnType
from microbatch.errors import SpecError
from microbatch.formats.avro import HEADER_BYTES as WIRE_HEADER
from microbatch.formats.avro import reader_fields
from microbatch.transform import ERROR_COLUMN, EVENT_TIME_COLUMN, HEADERS_COLUMN, LATE_COLUMN, RECORD_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("json", "text")
DEFAULT_JSON_COLUMNS = {"id": "text", "amount": "bigint"}
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
# The Spark type `from_json` reads each column type as (the transform's copy is written with it).
SPARK_TYPES = {
    "text": "StringType()", "bigint": "LongType()", "integer": "IntegerType()", "smallint": "ShortType()",
    "double precision": "DoubleType()", "real": "FloatType()", "numeric": "DecimalType(38, 10)",
    "boolean": "BooleanType()", "timestamptz": "TimestampType()", "timestamp": "TimestampNTZType()",
    "date": "DateType()", "jsonb": "StringType()", "bytea": "BinaryType()", "uuid": "StringType()",
}


def parse_columns(text: str) -> dict[str, str]:
    """`"id:text,amount:bigint"` -> {"id": "text", "amount": "bigint"}; a bad entry is one sentence."""
    columns: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, kind = entry.partition(":")
        name, kind = name.strip(), kind.strip() or "text"
        if not _NAME.match(name) or name in SOURCE_COORDINATES:
            raise SpecError(f"'{name}' is not a column name a pipeline can declare.",
                            fix="Use lower-case letters, digits and _, and not topic, partition or offset.")
        if kind not in get_args(ColumnType):
            raise SpecError(f"Column '{name}' has the type '{kind}', which a sink does not support.",
                            fix=f"Use one of: {', '.join(get_args(ColumnType))}.")
        columns[name] = kind
    if not columns:
        raise SpecError("--columns declares no column.", fix="Give NAME:TYPE pairs, e.g. id:text,amount:bigint.")
    return columns


def paths(name: str, root: Path = ROOT) -> dict[str, Path]:
    return {"spec": root / "include" / "pipelines" / f"{name}.yaml", "transform": root / "spark_jobs" / f"{name}.py",
            "test": root / "tests" / "unit" / f"test_{name}.py", "dag": root / "dags" / f"{name}.py"}


def check_new_name(name: str, root: Path = ROOT, kinds: tuple[str, ...] = ("spec", "transform", "test", "dag"),
                   ) -> dict[str, Path]:
    """The paths a new pipeline `name` gets; SpecError for a bad name or one whose files exist."""
    if not _NAME.match(name):
        raise SpecError(f"'{name}' is not a pipeline name.", fix="Use lower-case letters, digits and _ "
                        "(at most 41 characters), starting with a letter.")
    targets = paths(name, root)
    existing = [p for p in targets.values() if p.exists()]
    if existing:
        raise SpecError(f"A pipeline '{name}' exists already ({existing[0].relative_to(root)}).",
                        fix="Choose another name, or edit the existing files.")
    return {kind: path for kind, path in targets.items() if kind in kinds}


def new_pipeline(name: str, topic: str, fmt: str, columns: dict[str, str] | None = None,
                 root: Path = ROOT) -> dict[str, Path]:
    """Write the four files; refuse a bad or existing name before writing any."""
    if fmt not in FORMATS:
        check_new_name(name, root)
        raise SpecError(f"'{fmt}' is not a format.", fix="Use --format json or --format text.")
    targets = check_new_name(name, root)
    if fmt == "text":
        columns = {"line": "text"}
    columns = dict(columns or DEFAULT_JSON_COLUMNS)
    texts = {"spec": _spec(name, topic, fmt, columns), "transform": _transform(name, topic, fmt, columns),
             "test": _test(name, fmt, columns), "dag": _dag(name)}
    for kind, path in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[kind])
    return targets


def _spec(name: str, topic: str, fmt: str, columns: dict[str, str]) -> str:
    what = "JSON objects" if fmt == "json" else "text lines"
    declared = "".join(f"      {column}: {kind}\n" for column, kind in columns.items())
    return f"""# Generated by `microbatch new {name} --topic {topic} --format {fmt}`: {what} from {topic}, each
# valid record one row of the table {name}, with its topic, partition and offset. Edit freely; after a change
# to columns, run `microbatch migrate` (new nullable columns are added; a dropped or retyped one is refused).
name: {name}
description: {what.capitalize()} from {topic}, one row each.
schedule: 1m
source:
  topics: [{topic}]
  startup: earliest
  max_records_per_batch: 100000
job:
  transform: spark_jobs.{name}:transform
sinks:
  - name: {name}
    type: postgres_append
    table: {name}
    columns:                       # keep in step with COLUMNS in spark_jobs/{name}.py
{declared}retries:
  count: 3
  delay_seconds: 10
spark:
  mode: auto                       # a Spark Connect client where MICROBATCH_SPARK_REMOTE is set, else spark-submit
  conf:
    spark.sql.shuffle.partitions: "2"
"""


def _transform(name: str, topic: str, fmt: str, columns: dict[str, str]) -> str:
    spark_types = sorted({SPARK_TYPES[kind].split("(")[0] for kind in columns.values()} | {"StructField",
                                                                                            "StructType"})
    declared = "".join(f"    {column!r}: {kind!r},\n" for column, kind in columns.items())
    fields = "".join(f"    StructField({column!r}, {SPARK_TYPES[kind]}),\n" for column, kind in columns.items())
    if fmt == "json":
        doc = (f"Each record of `{topic}` is a JSON object with the fields of COLUMNS, all required; a record that "
               "is not one\nis a dead letter.")
        parse = '''        value = F.col("value").cast("string")
        fields = records.select(*SOURCE, F.from_json(value, SCHEMA).alias("_r"))
        values = [F.col(f"_r.{column}").alias(column) for column in COLUMNS]
        missing = F.lit(False)
        for column in COLUMNS:
            missing = missing | F.col(f"_r.{column}").isNull()
        error = (F.when(F.col("value").isNull(), F.lit("empty record"))
                 .when(F.col("_r").isNull() | missing, F.lit(ERROR)))
        return fields.select(*SOURCE, *values, error.alias("error"), F.lit(False).alias("late"),
                             F.lit(None).cast("timestamp").alias("event_time"))'''
        extra = (f'ERROR = "not a JSON object with the fields {", ".join(columns)} of the declared types"\n'
                 f'SCHEMA = StructType([\n{fields}])\n')
    else:
        doc = f"Each record of `{topic}` is one `line` (UTF-8); an empty record is a dead\nletter."
        parse = '''        error = F.when(F.col("value").isNull() | (F.length("value") == 0), F.lit("empty record"))
        return records.select(*SOURCE, F.col("value").cast("string").alias("line"), error.alias("error"),
                              F.lit(False).alias("late"), F.lit(None).cast("timestamp").alias("event_time"))'''
        extra = ""
    types_import = (f"from pyspark.sql.types import {', '.join(spark_types)}\n" if fmt == "json" else "")
    return f'''"""The transform of the `{name}` pipeline (generated by `microbatch new`; edit freely).

{doc} Every good record becomes one row of the sink `{name}`:
COLUMNS (keep them in step with include/pipelines/{name}.yaml) and the source `topic`, `partition` and
`offset`. No event time: nothing is late, and the state stays empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
{types_import}
SINK = {name!r}
SOURCE = ["topic", "partition", "offset", "value"]
COLUMNS = {{
{declared}}}
{extra}

class Transform:
    """Implements `microbatch.transform.SparkJob`."""

    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
{parse}

    def state_metrics(self, options: Mapping[str, Any]) -> dict[str, Column]:
        return {{}}

    def next_state(
        self, state: Mapping[str, Any], metrics: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        return dict(state)

    def outputs(
        self, parsed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]
    ) -> dict[str, DataFrame]:
        return {{SINK: parsed.select(*COLUMNS, "topic", "partition", "offset")}}


transform = Transform()
'''


def _test(name: str, fmt: str, columns: dict[str, str]) -> str:
    if fmt == "json":
        sample = {column: _sample(kind) for column, kind in columns.items()}
        good = repr(_json(sample).encode())
        checks = "".join(f"    assert rows[0][{column!r}] is not None\n" for column in columns)
        bad = "[b'{not json', b'[1, 2]', None]"
    else:
        good, checks, bad = "b'GET /index.html 200'", "    assert rows[0]['line'] == 'GET /index.html 200'\n", \
            "[b'', None]"
    return f'''"""The `{name}` transform on a local Spark session: good records become rows, the others dead letters
(generated by `microbatch new`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs.{name} import COLUMNS, SINK, transform


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder.master("local[1]").appName("test_{name}")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    yield session
    session.stop()


def test_good_records_become_rows_and_bad_ones_dead_letters(spark: SparkSession) -> None:
    bad = {bad}
    values = [{good}, *bad]
    records = spark.createDataFrame([("t", 0, offset, value) for offset, value in enumerate(values)],
                                    "topic string, partition int, offset long, value binary")
    parsed = transform.parse(records, {{}}, {{}})
    errors = [row["error"] for row in parsed.orderBy("offset").collect()]
    assert errors[0] is None and all(errors[1:]), errors
    assert transform.next_state({{}}, {{}}, {{}}) == {{}}
    rows = [row.asDict() for row in transform.outputs(parsed.where("error IS NULL"), {{}}, {{}})[SINK].collect()]
    assert len(rows) == 1 and set(rows[0]) == {{*COLUMNS, "topic", "partition", "offset"}}
{checks}'''


def _sample(kind: str) -> object:
    return {"bigint": 1, "integer": 1, "smallint": 1, "double precision": 1.5, "real": 1.5, "numeric": 1.5,
            "boolean": True, "timestamptz": "2026-11-25T10:00:00Z", "timestamp": "2026-11-25T10:00:00",
            "date": "2026-11-25", "uuid": "00000000-0000-0000-0000-000000000001"}.get(kind, "x")


def _json(value: object) -> str:
    import json

    return json.dumps(value)


def _dag(name: str) -> str:
    return f'''"""Airflow DAG of the `{name}` pipeline (generated by `microbatch new`). Thin on purpose: the spec
and the factory do the work."""

from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag

dag = pipeline_dag({name!r})
backfill = backfill_dag({name!r})
maintenance = maintenance_dag({name!r})  # None until the spec has a delta sink
'''


# `microbatch new NAME --from-topic TOPIC`: a YAML-only pipeline whose formats and columns are inferred from a
# sample of the live topic (`microbatch.kafka.sampling`). The inference below is pure: sampled bytes in, spec out.

INFER_RESERVED = (*RECORD_COLUMNS, HEADERS_COLUMN, ERROR_COLUMN, LATE_COLUMN, EVENT_TIME_COLUMN)
"""Names a decoded column may not take (the record's columns and the job contract's): the field is read with
`from` into `payload_<name>`."""
_DATE = r"\d{4}-\d{2}-\d{2}"
_TIME = _DATE + r"[T ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?"
_ZONED = re.compile(_TIME + r"(?:Z|[+-]\d{2}:\d{2})")
_NAIVE = re.compile(_TIME)
_DAY = re.compile(_DATE)
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BIGINT = (-(2**63), 2**63 - 1)
_POSTGRES = {**POSTGRES_FOR_SPARK, "decimal(38,0)": "numeric"}
_TEMPORAL = ("date", "timestamp_ntz", "timestamp")
_NUMERIC = ("bigint", "decimal(38,0)", "double")
EPOCH_SINCE = datetime(2000, 1, 1, tzinfo=UTC)
EPOCH_AHEAD = timedelta(days=366)
"""The times an epoch number is taken for: from EPOCH_SINCE to a year after now (in any of the units)."""
_EPOCH_SCALES = {"s": 1, "ms": 1_000, "us": 1_000_000}
_EPOCH_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
_DIGITS = re.compile(r"[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class JsonType:
    """What the sampled values of one JSON field were: `kind` is null (only nulls seen), boolean, bigint,
    decimal(38,0), double, string, date, timestamp_ntz, timestamp, array (`element`), struct (`fields`, in order of
    first sight), map (`element`: an object whose names are not identifiers) or variant (kinds that do not mix)."""

    kind: str
    element: JsonType | None = None
    fields: tuple[tuple[str, JsonType], ...] = ()

    @property
    def spark(self) -> str:
        """The Spark SQL type the json format declares for it (a field only ever null is declared a string)."""
        if self.kind == "null":
            return "string"
        if self.kind in ("array", "map"):
            assert self.element is not None
            return f"array<{self.element.spark}>" if self.kind == "array" else f"map<string,{self.element.spark}>"
        if self.kind == "struct":
            return "struct<" + ", ".join(f"{name}: {kind.spark}" for name, kind in self.fields) + ">"
        return self.kind


NULL = JsonType("null")


def observe(value: object) -> JsonType:
    """The type of one parsed JSON value."""
    if isinstance(value, list):
        return JsonType("array", element=merged(observe(item) for item in value))
    if isinstance(value, dict):
        fields = tuple((name, observe(item)) for name, item in value.items())
        if _struct_names([name for name, _ in fields]):
            return JsonType("struct", fields=fields)
        return JsonType("map", element=merged(kind for _, kind in fields))
    return JsonType(_scalar_kind(value))


def _scalar_kind(value: object) -> str:
    if value is None:
        kind = "null"
    elif isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int):
        kind = "bigint" if _BIGINT[0] <= value <= _BIGINT[1] else "decimal(38,0)" if len(str(abs(value))) <= 38 \
            else "double"
    elif isinstance(value, float):
        kind = "double"
    else:
        kind = _string_kind(str(value))
    return kind


def merged(kinds: Iterable[JsonType]) -> JsonType:
    """The one type of all `kinds` (null for none)."""
    result = NULL
    for kind in kinds:
        result = merge(result, kind)
    return result


def _string_kind(text: str) -> str:
    """An ISO-8601 time that Python and Spark both read: timestamp with an offset or Z, timestamp_ntz without one,
    date for a day alone; any other string is a string."""
    for pattern, kind in ((_ZONED, "timestamp"), (_NAIVE, "timestamp_ntz"), (_DAY, "date")):
        if pattern.fullmatch(text):
            try:
                datetime.fromisoformat(text)
            except ValueError:
                return "string"
            return kind
    return "string"


def _struct_names(names: list[str]) -> bool:
    """Whether an object's names can be a struct's fields: identifiers, not two of one spelling but for case."""
    return bool(names) and all(_FIELD.fullmatch(n) for n in names) and len({n.lower() for n in names}) == len(names)


def merge(a: JsonType, b: JsonType) -> JsonType:
    """The one type that holds the values of both: null gives way, numbers widen (bigint, decimal, double), times
    widen (date, timestamp_ntz, timestamp) and fall back to string, arrays and maps merge their elements, structs
    their fields (a struct and a map, or the names a map must have, make a map); anything else is a variant."""
    if a.kind == "null" or a == b:
        return b
    if b.kind == "null":
        return a
    kinds = {a.kind, b.kind}
    if kinds <= set(_NUMERIC):
        return JsonType(max(kinds, key=_NUMERIC.index))
    if kinds <= {"string", *_TEMPORAL}:
        return JsonType("string" if "string" in kinds else max(kinds, key=_TEMPORAL.index))
    return _merge_containers(a, b)


def _merge_containers(a: JsonType, b: JsonType) -> JsonType:
    kinds = {a.kind, b.kind}
    if kinds == {"array"}:
        assert a.element is not None and b.element is not None
        return JsonType("array", element=merge(a.element, b.element))
    if kinds == {"struct"}:
        fields = dict(a.fields)
        for name, kind in b.fields:
            fields[name] = merge(fields.get(name, NULL), kind)
        if _struct_names(list(fields)):
            return JsonType("struct", fields=tuple(fields.items()))
    if kinds <= {"struct", "map"}:
        return JsonType("map", element=merge(_values(a), _values(b)))
    return JsonType("variant")


def _values(kind: JsonType) -> JsonType:
    """The merged type of the values of an object (a map's element, or every field of a struct)."""
    if kind.kind == "map":
        assert kind.element is not None
        return kind.element
    return merged(field for _, field in kind.fields)


@dataclass(frozen=True)
class Epoch:
    """A field read as epoch times: its `unit` (s, ms or us) and what the sample held, for the summary."""

    unit: str
    seen: str

    @property
    def described(self) -> str:
        """`epoch milliseconds (13-digit integers near now)`."""
        return f"epoch {_EPOCH_NAMES[self.unit]} ({self.seen} near now)"


def epoch_unit(values: Iterable[object], now: datetime) -> Epoch | None:
    """The unit of epoch time every one of `values` (a field's non-null sampled values) is, read in it, a time from
    EPOCH_SINCE to a year after `now`: s (10 digits today), ms (13) or us (16); None when there is no value, or one
    is no integer or string of digits (without a leading zero), or they fall near now in no one unit."""
    numbers: list[int] = []
    kinds: set[str] = set()
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            numbers.append(value)
            kinds.add("integers")
        elif isinstance(value, str) and _DIGITS.fullmatch(value):
            numbers.append(int(value))
            kinds.add("strings of digits")
        else:
            return None
    if not numbers:
        return None
    moment = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    since, until = int(EPOCH_SINCE.timestamp()), int((moment + EPOCH_AHEAD).timestamp())
    for unit, scale in _EPOCH_SCALES.items():
        if all(since * scale <= n <= until * scale for n in numbers):
            digits = sorted({len(str(n)) for n in numbers})
            width = "- or ".join(str(d) for d in digits)  # 13, or 9- or 10 (seconds before 2001-09-09)
            return Epoch(unit, f"{width}-digit {' and '.join(sorted(kinds))}")
    return None


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


def snake_case(name: str) -> str:
    """A lower-case SQL identifier for any JSON name: `userId` -> user_id, `user-id` -> user_id, `2fa` -> _2fa."""
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()
    text = re.sub(r"[^a-z0-9]+", "_", text).strip("_") or "field"
    return (f"_{text}" if text[0].isdigit() else text)[:48]


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def quote_sql(name: str) -> str:
    """`name` as a Spark SQL identifier: as it is where it parses as a column of that name, else in backticks."""
    if _FIELD.fullmatch(name):
        try:
            parsed = sqlglot.parse_one(f"SELECT {name} FROM records", read="spark")
        except sqlglot.errors.ParseError:
            parsed = None
        selected = parsed.expressions[0] if isinstance(parsed, exp.Select) else None
        if isinstance(selected, exp.Column) and not selected.table and selected.name == name:
            return name
    return "`" + name.replace("`", "``") + "`"


def _flatten(column: str, expression: str, kind: JsonType, origin: str, taken: set[str]) -> list[SinkColumn]:
    """The sink columns of one decoded value: an atomic one is one column, a struct one column per field (nested
    structs flattened too, `customer_address_city` from `customer['address']['city']`), and an array, a map or a
    variant one `text` column of its JSON (`to_json`)."""
    if kind.kind == "struct":
        out: list[SinkColumn] = []
        for name, field in kind.fields:
            out += _flatten(f"{column}_{snake_case(name)}", f"{expression}['{name}']", field, f"{origin}.{name}",
                            taken)
        return out
    name = _unique(column[:63], taken)
    if kind.kind in ("array", "map", "variant"):
        return [SinkColumn(name, "text", f"to_json({expression})", f"{origin} ({kind.spark}, as JSON text)")]
    spark = "string" if kind.kind == "null" else kind.kind
    return [SinkColumn(name, _POSTGRES[spark], expression, f"{origin} ({spark})")]


def _parse_object(data: bytes) -> dict[str, Any] | None:
    """A JSON object as Spark's parser reads it (UTF-8, no repeated name, no NaN or Infinity), else None."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({name for name, _ in items}) != len(items):
            raise ValueError("a repeated name")
        return dict(items)

    def constant(name: str) -> float:
        raise ValueError(name)

    try:
        parsed = json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except (UnicodeDecodeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def infer_side(side: str, datas: list[bytes | None], records: set[str], sink: set[str],
               avro_schema: Callable[[], str | None] | None = None, now: datetime | None = None) -> Side:
    """The format of a record's `side` ("key" or "value") from its sampled bytes: the Confluent wire format (every
    non-null one starts with the magic byte 0 and a schema id) -> avro, its fields those of the subject's latest
    schema (`avro_schema`, None when no registry is configured or it has no such subject); JSON objects (every
    non-null one) -> json, fields typed across the sample and `required` where every object has them non-null; else
    text where all are UTF-8; else raw. All null -> raw with no column. `records` and `sink`: the decoded columns
    and the sink's columns named so far; the ones named here are added. `now` (default: the current time): what
    an epoch time must be near (`epoch_unit`)."""
    present = [d for d in datas if d is not None]
    if not present:
        return Side("raw", None, (), f"none (every sampled {side} is null)")
    if all(len(d) >= WIRE_HEADER and d[0] == 0 for d in present):
        schema = avro_schema() if avro_schema is not None else None
        if schema is not None:
            return _avro_side(side, schema, records, sink)
        column = SinkColumn(_unique(side, sink), "bytea", side, f"{side} (bytes)")
        return Side("raw", None, (column,), "raw: every one starts as Avro in the Confluent wire format does, but no "
                    "schema registry answered for its subject; set MICROBATCH_SCHEMA_REGISTRY_URL to read it as avro")
    objects = [_parse_object(d) for d in present]
    if all(o is not None for o in objects):
        return _json_side(side, [o for o in objects if o is not None], len(datas), records, sink,
                          now or datetime.now(UTC))
    try:
        for data in present:
            data.decode("utf-8")
    except UnicodeDecodeError:
        column = SinkColumn(_unique(side, sink), "bytea", side, f"{side} (bytes)")
        return Side("raw", None, (column,), f"raw: not all UTF-8, kept as bytes in {column.name}")
    name = f"{side}_text"
    records.add(name)
    column = SinkColumn(_unique(name, sink), "text", name, f"{side} (UTF-8 text)")
    return Side("text", {"format": "text"}, (column,), f"text: UTF-8, not all JSON objects, into {column.name}")


def _avro_side(side: str, schema: str, records: set[str], sink: set[str]) -> Side:
    """The avro format of a side whose subject's latest schema is `schema`: each top-level field that has a column
    type (`formats.avro.reader_fields`), under a snake_case name; nested records, arrays and maps go to the sink as
    JSON text."""
    fields: dict[str, Any] = {}
    columns: list[SinkColumn] = []
    skipped: list[str] = []
    prefix = "" if side == "value" else "key_"
    for avro_name, spark in reader_fields(schema).items():
        if spark.startswith("!"):
            skipped.append(avro_name)
            continue
        field = snake_case(avro_name)
        if field in INFER_RESERVED:
            field = f"payload_{field}"
        field = _unique(field, {name.removeprefix(prefix) for name in records} | set(fields))
        column = f"{prefix}{field}"
        records.add(column)
        fields[field] = spark if field == avro_name else {"type": spark, "from": avro_name}
        name = _unique(column[:63], sink)
        if spark.startswith(("struct", "array", "map")):
            columns.append(SinkColumn(name, "text", f"to_json({quote_sql(column)})", f"{side}.{avro_name} ({spark}, "
                                      "as JSON text)"))
        else:
            kind = "numeric" if spark.startswith("decimal") else _POSTGRES[spark]
            columns.append(SinkColumn(name, kind, quote_sql(column), f"{side}.{avro_name} ({spark})"))
    summary = f"avro: the Confluent wire format; {len(fields)} field(s) of the subject's latest schema"
    if skipped:
        summary += f" ({', '.join(skipped)} left out: no column type; read them in a Python job)"
    return Side("avro", {"format": "avro", "fields": fields}, tuple(columns), summary)


def _json_side(side: str, objects: list[dict[str, Any]], sampled: int, records: set[str], sink: set[str],
               now: datetime) -> Side:
    kinds: dict[str, JsonType] = {}
    filled: dict[str, list[object]] = {}
    for obj in objects:
        for name, value in obj.items():
            kinds[name] = merge(kinds.get(name, NULL), observe(value))
            filled.setdefault(name, [])
            if value is not None:
                filled[name].append(value)
    fields: dict[str, Any] = {}
    required: list[str] = []
    columns: list[SinkColumn] = []
    notes: list[str] = []
    for json_name, kind in kinds.items():
        field = snake_case(json_name)
        if field in INFER_RESERVED:
            field = f"payload_{field}"
        prefix = "" if side == "value" else "key_"
        suffix, n = "", 2
        while f"{prefix}{field}{suffix}" in records or f"{field}{suffix}" in fields:
            suffix, n = f"_{n}", n + 1
        field += suffix
        column = f"{prefix}{field}"
        records.add(column)
        if len(filled[json_name]) == len(objects):
            required.append(field)
        epoch = epoch_unit(filled[json_name], now)
        if epoch is None:
            fields[field] = kind.spark if field == json_name else {"type": kind.spark, "from": json_name}
            columns += _flatten(column, quote_sql(column), kind, f"{side}.{json_name}", sink)
            continue
        declared = {"type": "timestamp", "unit": epoch.unit, **({} if field == json_name else {"from": json_name})}
        fields[field] = declared
        columns.append(SinkColumn(_unique(column[:63], sink), _POSTGRES["timestamp"], quote_sql(column),
                                  f"{side}.{json_name} (epoch {epoch.unit})"))
        flow = ", ".join(f"{k}: {v}" for k, v in declared.items())
        notes.append(f"{side}.{json_name}: {epoch.described}, declared {{{flow}}}")
    spec: dict[str, Any] = {"format": "json", "fields": fields}
    if required:
        spec["required"] = required
    nulls = f" ({sampled - len(objects)} null)" if sampled > len(objects) else ""
    summary = (f"json: {len(objects)} object(s){nulls}, {len(fields)} field(s), required: "
               f"{', '.join(required) or 'none'}")
    return Side("json", spec, tuple(columns), summary, tuple(notes))


def infer_pipeline(name: str, topic: str, keys: list[bytes | None], values: list[bytes | None],
                   avro_schema: Callable[[str], str | None] | None = None, now: datetime | None = None,
                   ) -> Inference:
    """The YAML-only pipeline of the sampled records' keys and values: the source's formats and one
    `postgres_append` sink named `name` whose columns are the decoded ones (flattened, see `_flatten`) and whose
    `sql` selects them from `records`. `avro_schema`: the latest schema of a registry subject, or None. `now`
    (default: the current time, taken once): what an epoch time must be near (`epoch_unit`)."""
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


SAMPLED_FILES = ("spec", "test", "dag")
"""What `new --from-topic` writes: no transform, the sink's `sql` is the job."""


def new_pipeline_from_sample(name: str, topic: str, keys: list[bytes | None], values: list[bytes | None],
                             root: Path = ROOT, avro_schema: Callable[[str], str | None] | None = None,
                             now: datetime | None = None) -> tuple[dict[str, Path], Inference]:
    """Write the spec, its unit test and the DAG file of the pipeline inferred from the sampled keys and values;
    refuse a bad or existing name before writing any."""
    targets = check_new_name(name, root, SAMPLED_FILES)
    inference = infer_pipeline(name, topic, keys, values, avro_schema, now)
    texts = {"spec": spec_yaml(inference, topic), "test": _sampled_test(inference), "dag": _dag(name)}
    for kind, path in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[kind])
    return targets, inference


class _Dumper(yaml.SafeDumper):
    """Block style, with a multi-line string (the sink's sql) as a literal block."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)


def spec_yaml(inference: Inference, topic: str) -> str:
    """The spec as YAML, with a header that says where it came from and what to check."""
    name = inference.spec["name"]
    header = (f"# Generated by `microbatch new {name} --from-topic {topic}` from {inference.sampled} sampled "
              "record(s):\n# the formats, the fields and their types are a guess from those records; check them. A "
              "record that does\n# not fit (a required field missing, a field of another type) is a dead letter "
              "with the reason. After a\n# change to the sink's columns, run `microbatch migrate` (new nullable "
              "columns are added; a dropped or\n# retyped one is refused).\n")
    return header + yaml.dump(inference.spec, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def _sampled_test(inference: Inference) -> str:
    name = inference.spec["name"]
    source = inference.spec["source"]
    formats = {side: source.get(side, {}).get("format", "raw") for side in ("key", "value")}
    columns = "".join(f"    {column!r}: {kind!r},\n" for column, kind in inference.sink_columns.items())
    return f'''"""The `{name}` pipeline's spec loads, and its sink's query gives the sink's columns (generated by
`microbatch new --from-topic`; no Spark, no Kafka). Keep COLUMNS in step with include/pipelines/{name}.yaml."""

from __future__ import annotations

from pathlib import Path

from microbatch.config import load_spec

SPEC = Path(__file__).resolve().parents[2] / "include" / "pipelines" / "{name}.yaml"
FORMATS = {formats!r}
COLUMNS = {{
{columns}}}


def test_the_spec_loads_and_the_query_gives_the_sink_columns() -> None:
    spec = load_spec(SPEC)  # checks every sink's query too
    assert {{"key": spec.source.key.format, "value": spec.source.value.format}} == FORMATS
    sink = next(s for s in spec.sinks if s.name == {name!r})
    assert spec.job is None
    assert dict(sink.columns) == COLUMNS
    query = spec.sink_queries()[sink.name]
    assert list(query.columns) == list(COLUMNS)
    assert [name for _, name in query.select] == [*COLUMNS, "topic", "partition", "offset"]
'''
