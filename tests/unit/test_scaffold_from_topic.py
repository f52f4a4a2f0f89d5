"""`microbatch new --from-topic`: the pure inference (sampled bytes in, spec out), the files it writes (the spec
loads, its query is checked, the generated test passes and lints clean) and the CLI's refusals. No Kafka, no Spark:
the e2e test samples a live topic and runs what was written."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from microbatch import scaffold
from microbatch.config import PipelineSpec, load_spec
from microbatch.errors import SpecError
from microbatch.kafka.sampling import SampledRecord, quotas
from microbatch.scaffold import JsonType, epoch_unit, infer_pipeline, infer_side, merge, observe


def _kind(*values: object) -> str:
    result = scaffold.NULL
    for value in values:
        result = merge(result, observe(value))
    return result.spark if result.kind != "null" else "null"


@pytest.mark.parametrize(("values", "expected"), [
    (["a", "b"], "string"),
    ([1, -(2**63), 2**63 - 1], "bigint"),
    ([1, 1.5], "double"),
    ([2**63], "decimal(38,0)"),
    ([2**63, 1, 2.5], "double"),
    ([10**40], "double"),
    ([True, False], "boolean"),
    ([True, 1], "variant"),
    (["x", 1], "variant"),
    ([None, None], "null"),
    ([None, 3], "bigint"),
    (["2026-11-25T10:00:00Z", "2026-11-25 10:00:00.123456+01:00"], "timestamp"),
    (["2026-11-25T10:00:00", "2026-11-25T10:00:00.5"], "timestamp_ntz"),
    (["2026-11-25"], "date"),
    (["2026-11-25", "2026-11-25T10:00:00"], "timestamp_ntz"),
    (["2026-11-25T10:00:00", "2026-11-25T10:00:00Z"], "timestamp"),
    (["2026-11-25T10:00:00Z", "soon"], "string"),
    (["2026-13-45T10:00:00Z"], "string"),  # the shape of a time, but no day Python (or Spark) reads
    (["2026-11-25T10:00Z"], "string"),  # no seconds: not guessed as a time
    (["2026-11-25T10:00:00.1234567Z"], "string"),  # beyond microseconds
    ([[1, 2], [], [3.5]], "array<double>"),
    ([[]], "array<string>"),
    ([[None]], "array<string>"),
    ([{"a": 1}, {"b": "x"}], "struct<a: bigint, b: string>"),
    ([{"a": {"b": 1}}, {"a": {"c": [True]}}], "struct<a: struct<b: bigint, c: array<boolean>>>"),
    ([{"user-1": 1, "user-2": 2}], "map<string,bigint>"),
    ([{"a": 1, "A": 2}], "map<string,bigint>"),
    ([{}], "map<string,string>"),
    ([{"a": 1}, {"x-y": 2.5}], "map<string,double>"),
    ([{"a": 1}, [1]], "variant"),
])
def test_the_type_of_a_field_is_merged_across_the_sample(values: list[object], expected: str) -> None:
    assert _kind(*values) == expected


def test_merge_is_order_free_for_the_kinds_that_widen() -> None:
    kinds = [observe(v) for v in (1, 2.5, 2**63, "2026-11-25", "2026-11-25T10:00:00Z", None)]
    for a in kinds:
        for b in kinds:
            assert merge(a, b) == merge(b, a)
    assert merge(JsonType("null"), JsonType("bigint")) == JsonType("bigint")


@pytest.mark.parametrize(("name", "expected"), [
    ("id", "id"), ("userId", "user_id"), ("HTTPStatus", "http_status"), ("user-id", "user_id"),
    ("2fa", "_2fa"), ("a.b c", "a_b_c"), ("---", "field"), ("Ünïcode", "n_code"), ("x" * 80, "x" * 48),
])
def test_snake_case(name: str, expected: str) -> None:
    assert scaffold.snake_case(name) == expected


def _json(*objects: object) -> list[bytes | None]:
    return [None if o is None else json.dumps(o).encode() for o in objects]


def test_json_objects_give_typed_fields_required_where_always_present_and_not_null() -> None:
    side = infer_side("value", _json({"id": "a", "n": 1, "note": None, "only": 1},
                                     {"id": "b", "n": 2.5, "note": "x"}, None), set(), set())
    assert side.format == "json"
    assert side.spec == {"format": "json", "fields": {"id": "string", "n": "double", "note": "string",
                                                      "only": "bigint"}, "required": ["id", "n"]}
    assert [(c.name, c.type, c.expression) for c in side.columns] == [
        ("id", "text", "id"), ("n", "double precision", "n"), ("note", "text", "note"), ("only", "bigint", "only")]
    assert "2 object(s) (1 null)" in side.summary


@pytest.mark.parametrize(("datas", "fmt", "columns"), [
    ([b"GET /", b"{\"a\": 1}", None], "text", [("value_text", "text", "value_text")]),
    ([b"[1, 2]", b"3"], "text", [("value_text", "text", "value_text")]),  # JSON, but not objects
    ([b'{"a": 1, "a": 2}'], "text", [("value_text", "text", "value_text")]),  # Spark refuses a repeated name
    ([b'{"a": NaN}'], "text", [("value_text", "text", "value_text")]),  # not JSON to Spark
    ([b""], "text", [("value_text", "text", "value_text")]),
    ([b"\xff\x00", b"ok"], "raw", [("value", "bytea", "value")]),
    ([b'{"a": "\xff"}'], "raw", [("value", "bytea", "value")]),
    ([None, None], "raw", []),
])
def test_a_value_that_is_not_always_a_json_object_is_text_if_utf8_else_raw(
    datas: list[bytes | None], fmt: str, columns: list[tuple[str, str, str]]
) -> None:
    side = infer_side("value", datas, set(), set())
    assert side.format == fmt
    assert [(c.name, c.type, c.expression) for c in side.columns] == columns
    assert side.spec == ({"format": "text"} if fmt == "text" else None)


def _spec(inference: scaffold.Inference) -> PipelineSpec:
    return PipelineSpec.model_validate(inference.spec)


def test_nested_objects_are_flattened_arrays_kept_as_json_text_and_the_spec_loads() -> None:
    values = _json({"id": 1, "customer": {"name": "ann", "address": {"city": "Oslo", "zip": "0150"}},
                    "tags": ["a"], "attrs": {"k-1": 1}, "mixed": 1},
                   {"id": 2, "customer": {"name": "bob"}, "tags": [], "attrs": {}, "mixed": "one"})
    inference = infer_pipeline("orders", "orders_src", [None, None], values)
    spec = _spec(inference)
    assert spec.source.key.format == "raw" and spec.source.value.format == "json"
    assert inference.spec["source"]["value"]["fields"]["customer"] == (
        "struct<name: string, address: struct<city: string, zip: string>>")
    (sink,) = spec.sinks
    assert dict(sink.columns) == {"id": "bigint", "customer_name": "text", "customer_address_city": "text",
                                  "customer_address_zip": "text", "tags": "text", "attrs": "text", "mixed": "text"}
    query = spec.sink_queries()["orders"]
    assert dict((n, e) for e, n in query.select) == {
        "id": "id", "customer_name": "customer['name']", "customer_address_city": "customer['address']['city']",
        "customer_address_zip": "customer['address']['zip']", "tags": "TO_JSON(tags)", "attrs": "TO_JSON(attrs)",
        "mixed": "TO_JSON(mixed)", "topic": "`topic`", "partition": "`partition`", "offset": "`offset`"}
    assert spec.records_columns["mixed"] == "variant" and spec.records_columns["attrs"] == "map<string,bigint>"
    assert spec.job is None and spec.source.topics == ["orders_src"]


def test_names_that_are_no_sql_identifier_or_taken_are_renamed_and_read_with_from() -> None:
    keys = _json({"id": 7, "Timestamp": "2026-11-25"})
    values = _json({"key_id": "k", "userId": "u", "user_id": "v", "timestamp": 5, "offset": 1, "error": "e",
                    "late": False, "event_time": "2026-11-25T10:00:00Z", "select": 1, "order": {"by": 1},
                    "value_text": "t"})
    inference = infer_pipeline("orders", "t", keys, values)
    fields = inference.spec["source"]["value"]["fields"]
    assert fields == {
        "key_id_2": {"type": "string", "from": "key_id"}, "user_id": {"type": "string", "from": "userId"},
        "user_id_2": {"type": "string", "from": "user_id"},
        "payload_timestamp": {"type": "bigint", "from": "timestamp"},
        "payload_offset": {"type": "bigint", "from": "offset"},
        "payload_error": {"type": "string", "from": "error"}, "payload_late": {"type": "boolean", "from": "late"},
        "payload_event_time": {"type": "timestamp", "from": "event_time"}, "select": "bigint",
        "order": "struct<by: bigint>", "value_text": "string"}
    assert inference.spec["source"]["key"]["fields"] == {"id": "bigint", "payload_timestamp": {
        "type": "date", "from": "Timestamp"}}
    spec = _spec(inference)  # the decoded names do not clash (key_id is the key's, the value's is key_id_2)
    (sink,) = spec.sinks
    assert list(sink.columns)[:3] == ["key_id", "key_payload_timestamp", "key_id_2"]
    query = spec.sink_queries()["orders"]
    expressions = dict((n, e) for e, n in query.select)
    assert expressions["select"] == "`select`" and expressions["order_by"] == "order['by']"
    assert expressions["key_id_2"] == "key_id_2" and expressions["key_id"] == "key_id"


def test_a_text_key_and_a_raw_value_and_all_null_records() -> None:
    inference = infer_pipeline("events", "t", [b"k1", None, b"k2"], [b"\xff", b"\x00", None])
    spec = _spec(inference)
    assert spec.source.key.format == "text" and spec.source.value.format == "raw"
    assert dict(spec.sinks[0].columns) == {"key_text": "text", "value": "bytea"}
    assert "key_text" in inference.spec["sinks"][0]["sql"]
    with pytest.raises(SpecError, match="null key and a null value"):
        infer_pipeline("events", "t", [None], [None])


def test_the_summary_says_how_many_records_the_formats_and_each_column() -> None:
    inference = infer_pipeline("orders", "orders_src", _json({"id": 1}, {"id": 2}),
                               _json({"amount": 1.5, "at": "2026-11-25T10:00:00Z"}, {"amount": 2}))
    lines = inference.summary("orders_src")
    assert lines[0] == "sampled 2 record(s) of orders_src from the earliest offsets"
    assert lines[1] == "value: json: 2 object(s), 2 field(s), required: amount"
    assert lines[2] == "key: json: 2 object(s), 1 field(s), required: id"
    assert [line.split("->")[1].strip() for line in lines[3:]] == [
        "key_id bigint", "amount double precision", "at timestamptz"]


NOW = datetime(2026, 5, 9, 12, 0, tzinfo=UTC)
NOW_S = int(NOW.timestamp())  # 1778328000


@pytest.mark.parametrize(("values", "unit", "seen"), [
    ([NOW_S * 1000, NOW_S * 1000 - 86_400_000], "ms", "13-digit integers"),
    ([NOW_S, 1_600_000_000], "s", "10-digit integers"),
    ([NOW_S * 1_000_000 + 7], "us", "16-digit integers"),
    ([str(NOW_S * 1000), NOW_S * 1000 + 1], "ms", "13-digit integers and strings of digits"),
    (["1778328000123"], "ms", "13-digit strings of digits"),
    ([946_684_800, NOW_S], "s", "9- or 10-digit integers"),  # 2000-01-01 itself
    ([NOW_S + 365 * 86_400], "s", "10-digit integers"),  # within a year ahead
    ([NOW_S, 5], None, ""),  # a small integer: not a time, the field stays bigint
    ([946_684_799], None, ""),  # before 2000
    ([NOW_S + 367 * 86_400], None, ""),  # more than a year ahead
    ([NOW_S, NOW_S * 1000], None, ""),  # near now, but in two units
    ([NOW_S + 0.5], None, ""),
    ([True], None, ""),
    (["01778328000"], None, ""),  # a leading zero: an identifier, not a number
    ([" 1778328000"], None, ""),
    ([], None, ""),
])
def test_an_epoch_time_near_now_has_its_unit(values: list[object], unit: str | None, seen: str) -> None:
    epoch = epoch_unit(values, NOW)
    assert (epoch.unit if epoch else None) == unit
    if epoch is not None:
        assert epoch.seen == seen
        assert epoch_unit(values, NOW.replace(tzinfo=None)) == epoch  # a naive now is UTC


def test_epoch_times_are_declared_timestamps_with_their_unit_and_the_summary_says_so() -> None:
    values = _json({"id": 1, "ts": NOW_S * 1000, "sec": NOW_S, "us": NOW_S * 1_000_000, "text": str(NOW_S * 1000),
                    "mixed": NOW_S, "timestamp": NOW_S, "maybe": None},
                   {"id": 2, "ts": NOW_S * 1000 + 1, "sec": NOW_S + 1, "us": NOW_S * 1_000_000 + 1,
                    "text": str(NOW_S * 1000 + 1), "mixed": 3, "timestamp": NOW_S + 1, "maybe": NOW_S})
    inference = infer_pipeline("orders", "orders_src", _json({"at": NOW_S * 1000}, {"at": None}), values, now=NOW)
    assert inference.spec["source"]["value"]["fields"] == {
        "id": "bigint", "ts": {"type": "timestamp", "unit": "ms"}, "sec": {"type": "timestamp", "unit": "s"},
        "us": {"type": "timestamp", "unit": "us"}, "text": {"type": "timestamp", "unit": "ms"}, "mixed": "bigint",
        "payload_timestamp": {"type": "timestamp", "unit": "s", "from": "timestamp"},
        "maybe": {"type": "timestamp", "unit": "s"}}
    assert inference.spec["source"]["value"]["required"] == [
        "id", "ts", "sec", "us", "text", "mixed", "payload_timestamp"]
    assert inference.spec["source"]["key"]["fields"] == {"at": {"type": "timestamp", "unit": "ms"}}
    assert inference.sink_columns == {
        "key_at": "timestamptz", "id": "bigint", "ts": "timestamptz", "sec": "timestamptz", "us": "timestamptz",
        "text": "timestamptz", "mixed": "bigint", "payload_timestamp": "timestamptz", "maybe": "timestamptz"}
    lines = inference.summary("orders_src")
    assert "  value.ts (epoch ms)" in "\n".join(lines) and "  value.mixed (bigint)" in "\n".join(lines)
    assert lines[-7:] == [  # after the columns, one line per epoch field
        "key.at: epoch milliseconds (13-digit integers near now), declared {type: timestamp, unit: ms}",
        "value.ts: epoch milliseconds (13-digit integers near now), declared {type: timestamp, unit: ms}",
        "value.sec: epoch seconds (10-digit integers near now), declared {type: timestamp, unit: s}",
        "value.us: epoch microseconds (16-digit integers near now), declared {type: timestamp, unit: us}",
        "value.text: epoch milliseconds (13-digit strings of digits near now), declared {type: timestamp, unit: ms}",
        "value.timestamp: epoch seconds (10-digit integers near now), declared {type: timestamp, unit: s, "
        "from: timestamp}",
        "value.maybe: epoch seconds (10-digit integers near now), declared {type: timestamp, unit: s}",
    ]
    spec = _spec(inference)
    assert spec.source.value.fields["ts"].unit == "ms" and spec.source.value.fields["text"].unit == "ms"
    assert {n: spec.records_columns[n] for n in ("key_at", "ts", "sec", "us", "text", "mixed", "payload_timestamp")
            } == {"key_at": "timestamp", "ts": "timestamp", "sec": "timestamp", "us": "timestamp",
                  "text": "timestamp", "mixed": "bigint", "payload_timestamp": "timestamp"}


def test_a_nested_epoch_time_stays_a_number() -> None:
    side = infer_side("value", _json({"meta": {"ts": NOW_S * 1000}}), set(), set(), now=NOW)
    assert side.spec == {"format": "json", "fields": {"meta": "struct<ts: bigint>"}, "required": ["meta"]}
    assert side.notes == ()


def _load(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(f"generated_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_written_files_load_lint_clean_and_the_generated_test_passes(tmp_path: Path) -> None:
    values = _json({"id": "a", "amount": 1, "customer": {"name": "x"}, "tags": ["t"]}, {"id": "b", "amount": 2})
    written, inference = scaffold.new_pipeline_from_sample("orders", "orders_src", _json({"k": 1}, None), values,
                                                           root=tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written.values()) == [
        "dags/orders.py", "include/pipelines/orders.yaml", "tests/unit/test_orders.py"]
    spec = load_spec(written["spec"])
    assert spec.model_dump(by_alias=True, exclude_unset=True)["sinks"] == _spec(inference).model_dump(
        by_alias=True, exclude_unset=True)["sinks"]
    assert written["spec"].read_text().startswith("# Generated by `microbatch new orders --from-topic orders_src`")
    assert "pipeline_dag('orders')" in written["dag"].read_text()
    _load(written["test"]).test_the_spec_loads_and_the_query_gives_the_sink_columns()
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(scaffold.ROOT / "pyproject.toml"),
                           str(tmp_path)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SpecError, match="exists already"):
        scaffold.new_pipeline_from_sample("orders", "x", [None], _json({"a": 1}), root=tmp_path)
    with pytest.raises(SpecError, match="not a pipeline name"):
        scaffold.new_pipeline_from_sample("Bad-Name", "x", [None], _json({"a": 1}), root=tmp_path)
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_written_spec_with_epoch_times_loads_and_decodes_them_as_timestamps(tmp_path: Path) -> None:
    values = _json({"id": "a", "ts": NOW_S * 1000, "sent": str(NOW_S)}, {"id": "b", "ts": NOW_S * 1000 + 5})
    written, inference = scaffold.new_pipeline_from_sample("orders", "orders_src", [None, None], values,
                                                           root=tmp_path, now=NOW)
    text = written["spec"].read_text()
    assert "      ts:\n        type: timestamp\n        unit: ms\n" in text and "      id: string\n" in text
    spec = load_spec(written["spec"])
    fields = spec.source.value.fields
    assert [(f.type, f.unit) for f in fields.values()] == [("string", None), ("timestamp", "ms"), ("timestamp", "s")]
    assert (spec.records_columns["ts"], spec.records_columns["sent"]) == ("timestamp", "timestamp")
    assert dict(spec.sinks[0].columns) == {"id": "text", "ts": "timestamptz", "sent": "timestamptz"}
    assert list(spec.sink_queries()["orders"].columns) == list(inference.sink_columns)
    _load(written["test"]).test_the_spec_loads_and_the_query_gives_the_sink_columns()


@pytest.mark.parametrize(("available", "limit", "expected"), [
    ({0: 500, 1: 500, 2: 500, 3: 500}, 100, {0: 25, 1: 25, 2: 25, 3: 25}),
    ({0: 3, 1: 0, 2: 500}, 100, {0: 3, 2: 97}),
    ({0: 10, 1: 10}, 100, {0: 10, 1: 10}),
    ({0: 0, 1: 0}, 100, {}),
    ({0: 50, 1: 50, 2: 50}, 100, {0: 34, 1: 33, 2: 33}),
    ({p: 1 for p in range(150)}, 100, {p: 1 for p in range(100)}),
])
def test_the_sample_is_shared_among_the_partitions_that_hold_records(
    available: dict[int, int], limit: int, expected: dict[int, int]
) -> None:
    assert quotas(available, limit) == expected


def test_the_cli_wants_one_of_topic_and_from_topic_and_no_format_with_from_topic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from microbatch import cli
    from microbatch.kafka import sampling

    runner = CliRunner()
    for args, error in ((["new", "orders"], "exactly one of --topic and --from-topic"),
                        (["new", "orders", "--topic", "a", "--from-topic", "a"], "exactly one of"),
                        (["new", "orders", "--from-topic", "a", "--format", "text"], "do not go with it")):
        result = runner.invoke(cli.app, args)
        assert isinstance(result.exception, SpecError) and error in str(result.exception), args

    monkeypatch.setattr(scaffold, "ROOT", tmp_path)
    monkeypatch.setenv("MICROBATCH_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    ms = int(time.time() * 1000)  # the CLI takes the current time
    records = [SampledRecord(0, i, None, json.dumps({"id": f"o{i}", "amount": i, "at": ms + i}).encode())
               for i in range(3)]
    monkeypatch.setattr(sampling, "sample_topic", lambda kafka, topic: records)
    result = runner.invoke(cli.app, ["new", "orders", "--from-topic", "orders_src"])
    assert result.exit_code == 0, result.output
    assert "sampled 3 record(s) of orders_src" in result.output
    assert "value.amount (bigint)" in result.output and "wrote include/pipelines/orders.yaml" in result.output
    assert ("value.at: epoch milliseconds (13-digit integers near now), declared {type: timestamp, unit: ms}\n"
            in result.output)
    assert (tmp_path / "include" / "pipelines" / "orders.yaml").exists()
    assert not (tmp_path / "spark_jobs" / "orders.py").exists()


AVRO_SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "orderId", "type": "string"}, {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                                                        "precision": 10, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "offset", "type": "long"}, {"name": "lines", "type": {"type": "array", "items": "string"}},
    {"name": "either", "type": ["int", "string"]}]})


def test_avro_in_the_confluent_wire_format_takes_the_fields_of_the_subjects_latest_schema(tmp_path: Path) -> None:
    values = [b"\x00\x00\x00\x00\x07" + bytes([i]) for i in range(3)] + [None]
    asked: list[str] = []

    def latest(subject: str) -> str | None:
        asked.append(subject)
        return AVRO_SCHEMA if subject == "orders_src-value" else None

    written, inference = scaffold.new_pipeline_from_sample("orders", "orders_src", [b"k1", b"k2", b"k3", b"k4"],
                                                           values, root=tmp_path, avro_schema=latest)
    assert asked == ["orders_src-value"], "a key that is not in the wire format is not looked up"
    assert inference.value.spec == {"format": "avro", "fields": {
        "order_id": {"type": "string", "from": "orderId"}, "amount": "decimal(10,2)", "ts": "timestamp",
        "payload_offset": {"type": "bigint", "from": "offset"}, "lines": "array<string>"}}
    assert "either left out: no column type" in inference.value.summary
    assert inference.sink_columns["amount"] == "numeric" and inference.sink_columns["lines"] == "text"
    spec = load_spec(written["spec"])
    assert spec.source.value.format == "avro" and spec.source.key.format == "text"
    _load(written["test"]).test_the_spec_loads_and_the_query_gives_the_sink_columns()

    raw = infer_side("value", values, set(), set(), None)
    assert raw.format == "raw" and "set MICROBATCH_SCHEMA_REGISTRY_URL to read it as avro" in raw.summary
