"""Sinks' SQL queries (issue 44), checked when the spec loads, without Spark: each refusal is one sentence naming
the sink, and nothing opens; an accepted query gets what exactly-once needs added (the coordinates of a row sink,
the per-partition grouping of an aggregate) and its windows rewritten."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from microbatch.config import PipelineSpec, load_spec
from microbatch.errors import SpecError
from microbatch.sql import sink_query, window_width

COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "payment_id", "merchant", "amount_cents",
           "status", "ts"]
LOG = ["payment_id", "amount_cents"]
TOTALS = ["window_start", "window_end", "merchant", "amount_cents", "payments"]
TOTALS_SQL = ("SELECT window_start(ts) AS window_start, window_end(ts) AS window_end, merchant, "
              "SUM(amount_cents) AS amount_cents, COUNT(*) AS payments FROM records GROUP BY 1, 2, merchant")
SPEC = {
    "name": "captures",
    "source": {"topics": ["payments"], "value": {"format": "json", "fields": {
        "payment_id": "string", "merchant": "string", "amount_cents": "bigint", "status": "string",
        "ts": "timestamp"}}},
    "event_time": {"column": "ts", "window": "1m", "allowed_lateness": "5s"},
    "sinks": [
        {"name": "log", "type": "postgres_append", "table": "log", "columns": {"payment_id": "text",
                                                                               "amount_cents": "bigint"},
         "sql": "SELECT payment_id, amount_cents FROM records WHERE status = 'captured'"},
        {"name": "totals", "type": "postgres_aggregate", "table": "totals",
         "columns": {"window_start": "timestamptz", "window_end": "timestamptz", "merchant": "text",
                     "amount_cents": "bigint", "payments": "bigint"},
         "keys": ["window_start", "window_end", "merchant"], "sum_columns": ["amount_cents", "payments"],
         "window": {"start": "window_start", "end": "window_end"}, "sql": TOTALS_SQL},
    ],
}


def load(tmp_path: Path, spec: dict) -> PipelineSpec:
    path = tmp_path / "captures.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_spec(path)


def test_row_and_aggregate_queries_get_what_exactly_once_needs():
    rows = sink_query("log", "SELECT payment_id, amount_cents FROM Records WHERE status = 'captured'", "rows",
                      COLUMNS, LOG, None)
    assert rows.columns == ("payment_id", "amount_cents")
    assert [name for _, name in rows.select] == ["payment_id", "amount_cents", "topic", "partition", "offset"]
    assert rows.where == "status = 'captured'" and rows.group_by == ()
    totals = sink_query("totals", TOTALS_SQL, "partials", COLUMNS, TOTALS, 60)
    assert [name for _, name in totals.select] == [*TOTALS, "topic", "partition"]
    start = "TIMESTAMP_SECONDS(FLOOR(UNIX_SECONDS(CAST(ts AS TIMESTAMP)) / 60) * 60)"
    assert totals.group_by == (start, f"{start[:-1]} + 60)", "merchant", "`topic`", "`partition`")
    assert "GROUP BY" in totals.sql and "`partition`" in totals.sql
    assert window_width("1 minute") == window_width("60s") == 60 and window_width("2 hours") == 7200


@pytest.mark.parametrize(("sql", "words"), [
    ("SELECT payment_id, amount_cents FROM records JOIN other ON true", "uses JOIN"),
    ("SELECT payment_id, amount_cents FROM payments", "reads payments; a query reads the view records only"),
    ("SELECT * FROM records", "selects *; name the sink's columns"),
    ("SELECT payment_id, nope AS amount_cents FROM records", "names the column 'nope', which records lacks"),
    ("SELECT payment_id, amount_cents + rand() AS amount_cents FROM records", "calls rand(), whose result changes"),
    ("SELECT payment_id, unix_timestamp() AS amount_cents FROM records", "calls unix_timestamp()"),
    ("SELECT uuid() AS payment_id, amount_cents FROM records", "calls uuid()"),
    ("SELECT payment_id, amount_cents FROM records WHERE ts < current_timestamp()", "calls current_timestamp()"),
    ("SELECT payment_id FROM records", "returns payment_id, but the sink's columns are payment_id, amount_cents"),
    ("SELECT payment_id, amount_cents, `offset` FROM records", "returns offset, which the platform adds itself"),
    ("SELECT payment_id, sum(amount_cents) AS amount_cents FROM records GROUP BY 1", "must keep one row per record"),
    ("SELECT payment_id, amount_cents FROM records ORDER BY ts", "uses ORDER BY"),
    ("SELECT payment_id, amount_cents FROM (SELECT * FROM records)", "uses a subquery"),
    ("SELEC payment_id", "must be one SELECT"),
    ("SELECT payment_id, amount_cents FROM records WHERE (", "does not parse as Spark SQL"),
])
def test_bad_row_queries_are_refused_in_one_sentence(sql, words):
    with pytest.raises(ValueError) as refused:
        sink_query("log", sql, "rows", COLUMNS, LOG, None)
    assert str(refused.value).startswith("sinks: sink 'log' sql"), str(refused.value)
    assert words in str(refused.value), str(refused.value)


@pytest.mark.parametrize(("sql", "window", "words"), [
    (TOTALS_SQL.replace("SUM(amount_cents)", "AVG(amount_cents)"), 60, "'amount_cents' must be a SUM(...) or COUNT"),
    (TOTALS_SQL.split(" GROUP BY", maxsplit=1)[0], 60, "needs a GROUP BY of its key columns"),
    (TOTALS_SQL + " HAVING COUNT(*) > 1", 60, "uses HAVING"),
    (TOTALS_SQL, None, "without a width and event_time.window is not set"),
    (TOTALS_SQL.replace("window_start(ts)", "window_start(ts, '5 minutes')"), 60, "is 300 s wide, but event_time"),
    (TOTALS_SQL.replace("window_start(ts)", "window_start(ts, 'soon')"), 60, "'soon' is not a window width"),
    (TOTALS_SQL.replace("GROUP BY 1", "GROUP BY 9"), 60, "GROUP BY 9 is not a position"),
])
def test_bad_aggregate_queries_are_refused_in_one_sentence(sql, window, words):
    with pytest.raises(ValueError, match=r"^sinks: sink 'totals' sql") as refused:
        sink_query("totals", sql, "partials", COLUMNS, TOTALS, window)
    assert words in str(refused.value), str(refused.value)


def test_a_sql_pipeline_loads_and_a_python_job_reads_the_declared_event_time(tmp_path):
    spec = load(tmp_path, SPEC)
    assert spec.job is None and set(spec.sink_queries()) == {"log", "totals"}
    assert spec.job_options == {"window_seconds": 60, "allowed_lateness_seconds": 5.0, "max_future_seconds": 86_400.0}
    python = copy.deepcopy(SPEC)
    python["job"] = {"transform": "spark_jobs.clicks:transform", "options": {"user": 1}}
    for sink in python["sinks"]:
        sink.pop("sql")
    assert load(tmp_path, python).job_options == {"user": 1, "window_seconds": 60, "allowed_lateness_seconds": 5.0,
                                                  "max_future_seconds": 86_400.0}


def _without_sql(spec: dict) -> None:
    spec["sinks"][0].pop("sql")


@pytest.mark.parametrize(("change", "words"), [
    (lambda s: s.update(job={"transform": "spark_jobs.clicks:transform"}),
     "a pipeline is either a Python job or SQL per sink"),
    (_without_sql, "sink 'log' has no sql, and the pipeline has no job"),
    (lambda s: s["event_time"].update(column="when"), "event_time.column: 'when' is not a column of records"),
    (lambda s: s["event_time"].update(window="a minute"), "'a minute' is not a duration"),
    (lambda s: s["sinks"].append({"name": "out", "type": "kafka", "topic": "o", "source": "log",
                                  "key": "payment_id", "sql": "SELECT 1 FROM records"}),
     "publishes the rows of 'log'; give the query to that sink"),
    (lambda s: s["sinks"][1].update(sql=TOTALS_SQL.replace("merchant,", "status AS merchant,")),
     "'merchant' is neither a SUM/COUNT nor in the GROUP BY"),
])
def test_bad_sql_specs_are_refused_when_they_load(tmp_path, change, words):
    spec = copy.deepcopy(SPEC)
    change(spec)
    with pytest.raises(SpecError) as refused:
        load(tmp_path, spec)
    assert words in str(refused.value), str(refused.value)
    assert str(refused.value).startswith("captures.yaml: field '")


def test_python_jobs_keep_event_time_in_one_place(tmp_path):
    spec = copy.deepcopy(SPEC)
    spec["job"] = {"transform": "spark_jobs.clicks:transform", "options": {"window_seconds": 60}}
    for sink in spec["sinks"]:
        sink.pop("sql")
    with pytest.raises(SpecError) as refused:
        load(tmp_path, spec)
    assert "window_seconds is set by event_time now; remove it from job.options" in str(refused.value)


def test_a_struct_columns_field_is_a_column_of_records():
    query = sink_query("log", "SELECT customer.name AS payment_id, amount_cents FROM records", "rows",
                       [*COLUMNS, "customer"], LOG, None)
    assert query.select[0] == ("customer.name", "payment_id")
    with pytest.raises(ValueError, match="names the column 'name', which records lacks"):
        sink_query("log", "SELECT nobody.name AS payment_id, amount_cents FROM records", "rows", COLUMNS, LOG, None)


def _ts_as(declared: object):
    def change(spec: dict) -> None:
        spec["source"]["value"]["fields"]["ts"] = declared
    return change


@pytest.mark.parametrize(("declared", "words"), [
    ("bigint", "event_time.column: 'ts' is bigint, not a timestamp; if it holds epoch milliseconds, declare the "
               "field `ts: {type: timestamp, unit: ms}`"),
    ("string", "event_time.column: 'ts' is string, not a timestamp; declare the field `ts: timestamp` (ISO-8601)"),
    ("double", "is double, not a timestamp"),
    ({"type": "bigint", "unit": "ms"}, "unit reads an epoch number into a timestamp; the field is bigint"),
    ({"type": "timestamp", "unit": "ms", "format": "yyyy"}, "either a unit (an epoch number) or a format"),
    ({"type": "string", "format": "yyyy"}, "format reads a time string into a timestamp or date"),
    ({"type": "timestamp", "unit": "minutes"}, "unit"),
])
def test_an_event_time_that_is_not_a_time_or_a_reading_that_cannot_be_is_refused(tmp_path, declared, words):
    spec = copy.deepcopy(SPEC)
    _ts_as(declared)(spec)
    with pytest.raises(SpecError) as refused:
        load(tmp_path, spec)
    assert words in str(refused.value), str(refused.value)


@pytest.mark.parametrize("declared", [{"type": "timestamp", "unit": "ms"}, {"type": "timestamp_ntz", "unit": "s"},
                                      {"type": "timestamp", "format": "dd/MM/yyyy HH:mm:ss"}, "timestamp_ntz"])
def test_an_event_time_read_from_an_epoch_number_or_a_pattern_loads(tmp_path, declared):
    spec = copy.deepcopy(SPEC)
    _ts_as(declared)(spec)
    assert load(tmp_path, spec).records_columns["ts"] in ("timestamp", "timestamp_ntz")


def test_an_append_sink_may_keep_tombstones_and_an_upsert_may_not():
    spec = copy.deepcopy(SPEC)
    spec["sinks"][0]["keep_tombstones"] = True
    loaded = PipelineSpec.model_validate(spec)
    assert loaded.tombstone_sinks == ["log"] and loaded.record_keyed_sinks == []
    from microbatch.sinks.registry import sinks_of

    assert sinks_of(loaded)["log"].takes_tombstones and not sinks_of(loaded)["totals"].takes_tombstones
    upsert = {"name": "latest", "type": "delta", "mode": "upsert", "keys": ["payment_id"], "keep_tombstones": True,
              "columns": {"payment_id": "text"}, "sql": "SELECT payment_id FROM records"}
    with pytest.raises(ValueError, match="keep_tombstones: an upsert table applies a tombstone"):
        PipelineSpec.model_validate({**SPEC, "sinks": [upsert]})
