"""The text of the files `microbatch new` writes: a Python pipeline's spec, transform and unit test (`--format json`
or `--format text`: a JSON pipeline parses each record as a JSON object into the declared columns; a text pipeline
stores each record as one `line`), the unit test of a pipeline inferred from a topic, and either's DAG file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from microbatch.formats.json import JsonFormat
from microbatch.formats.text import TextFormat

if TYPE_CHECKING:
    from microbatch.scaffold.from_topic import Inference

DEFAULT_JSON_COLUMNS = {"id": "text", "amount": "bigint"}
# The Spark type `from_json` reads each column type as (the transform's copy is written with it).
SPARK_TYPES = {
    "text": "StringType()", "bigint": "LongType()", "integer": "IntegerType()", "smallint": "ShortType()",
    "double precision": "DoubleType()", "real": "FloatType()", "numeric": "DecimalType(38, 10)",
    "boolean": "BooleanType()", "timestamptz": "TimestampType()", "timestamp": "TimestampNTZType()",
    "date": "DateType()", "jsonb": "StringType()", "bytea": "BinaryType()", "uuid": "StringType()",
}


@dataclass(frozen=True)
class TransformParts:
    """What a format's transform fills in: the first sentence of its docstring, its `parse` body, the module's
    constants after COLUMNS, and the import of Spark types they use."""

    doc: str
    parse: str
    extra: str
    types_import: str


@dataclass(frozen=True)
class Starter:
    """How the Python pipeline of one format starts: what its records are, the columns it always has (None: the
    given ones, else DEFAULT_JSON_COLUMNS), its transform's parts, and its unit test's good record, checks of the
    row and bad records."""

    what: str
    columns: dict[str, str] | None
    transform: Callable[[str, dict[str, str]], TransformParts]
    test: Callable[[dict[str, str]], tuple[str, str, str]]


def _json_transform(topic: str, columns: dict[str, str]) -> TransformParts:
    spark_types = sorted({SPARK_TYPES[kind].split("(")[0] for kind in columns.values()} | {"StructField",
                                                                                            "StructType"})
    fields = "".join(f"    StructField({column!r}, {SPARK_TYPES[kind]}),\n" for column, kind in columns.items())
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
    return TransformParts(doc, parse, extra, f"from pyspark.sql.types import {', '.join(spark_types)}\n")


def _text_transform(topic: str, columns: dict[str, str]) -> TransformParts:
    doc = f"Each record of `{topic}` is one `line` (UTF-8); an empty record is a dead\nletter."
    parse = '''        error = F.when(F.col("value").isNull() | (F.length("value") == 0), F.lit("empty record"))
        return records.select(*SOURCE, F.col("value").cast("string").alias("line"), error.alias("error"),
                              F.lit(False).alias("late"), F.lit(None).cast("timestamp").alias("event_time"))'''
    return TransformParts(doc, parse, "", "")


def _json_test(columns: dict[str, str]) -> tuple[str, str, str]:
    sample = {column: _sample(kind) for column, kind in columns.items()}
    good = repr(_json(sample).encode())
    checks = "".join(f"    assert rows[0][{column!r}] is not None\n" for column in columns)
    return good, checks, "[b'{not json', b'[1, 2]', None]"


def _text_test(columns: dict[str, str]) -> tuple[str, str, str]:
    return "b'GET /index.html 200'", "    assert rows[0]['line'] == 'GET /index.html 200'\n", "[b'', None]"


STARTERS = {JsonFormat.name: Starter("JSON objects", None, _json_transform, _json_test),
            TextFormat.name: Starter("text lines", {"line": "text"}, _text_transform, _text_test)}
"""The formats `microbatch new --format` writes a Python pipeline of, by the format's name."""


def spec_file(name: str, topic: str, fmt: str, columns: dict[str, str]) -> str:
    """The spec of a Python pipeline of the format `fmt` (one of STARTERS)."""
    what = STARTERS[fmt].what
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


def transform_file(name: str, topic: str, fmt: str, columns: dict[str, str]) -> str:
    """The transform of a Python pipeline of the format `fmt` (one of STARTERS)."""
    declared = "".join(f"    {column!r}: {kind!r},\n" for column, kind in columns.items())
    parts = STARTERS[fmt].transform(topic, columns)
    doc, parse, extra, types_import = parts.doc, parts.parse, parts.extra, parts.types_import
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


def unit_test_file(name: str, fmt: str, columns: dict[str, str]) -> str:
    """The unit test of a Python pipeline's transform, on a local Spark session."""
    good, checks, bad = STARTERS[fmt].test(columns)
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


def dag_file(name: str) -> str:
    """The DAG file of pipeline `name`: the factory's three DAGs."""
    return f'''"""Airflow DAG of the `{name}` pipeline (generated by `microbatch new`). Thin on purpose: the spec
and the factory do the work."""

from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag

dag = pipeline_dag({name!r})
backfill = backfill_dag({name!r})
maintenance = maintenance_dag({name!r})  # None until the spec has a delta sink
'''


def sampled_test_file(inference: Inference) -> str:
    """The unit test of a pipeline inferred from a topic: its spec loads and its sink's query gives the sink's
    columns (no Spark, no Kafka)."""
    name = inference.spec["name"]
    formats = {"key": inference.key.format, "value": inference.value.format}
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
