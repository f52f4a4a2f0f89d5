"""`microbatch new --from-topic` on a Debezium topic: the debezium format says yes to change events only (with and
without the converter's schema part), infers the row's fields (exact types from the schema part, else from the
values, a base64 decimal noted), reads the key as the primary key, and the scaffold writes the upsert sink of
docs/your-own-pipeline.md section 6 (`orders_cdc`), a spec that loads. The records are shaped as Debezium 3.6.1's
PostgreSQL connector writes them with Kafka Connect's JsonConverter, field for field (`make cdc`'s table;
tests/integration/test_cdc_stack.py infers from the real ones)."""

from __future__ import annotations

import base64
import importlib.util
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from microbatch.config import load_spec
from microbatch.formats.debezium import DebeziumFormat
from microbatch.formats.inference import Sample
from microbatch.scaffold import infer_pipeline, new_pipeline_from_sample

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)
TOPIC = "cdc.public.orders"


def _field(field: str, kind: str, optional: bool = False, **more: Any) -> dict[str, Any]:
    """One field of a Kafka Connect struct schema, its keys in the JsonConverter's order."""
    return {"type": kind, "optional": optional, **more, "field": field}


ROW_SCHEMA = [
    _field("region", "string"),
    _field("order_id", "int64"),
    _field("amount", "bytes", name="org.apache.kafka.connect.data.Decimal", version=1,
           parameters={"scale": "2", "connect.decimal.precision": "12"}),
    _field("placed_at", "string", name="io.debezium.time.ZonedTimestamp", version=1),
    _field("note", "string", optional=True),
    _field("description", "string"),
]
"""The `make cdc` sample table's columns (include/microbatch/dev/cdc_stack.py) as the connector describes them."""
SOURCE_SCHEMA = {"type": "struct", "fields": [
    _field("version", "string"), _field("connector", "string"), _field("name", "string"), _field("ts_ms", "int64"),
    _field("snapshot", "string", optional=True, name="io.debezium.data.Enum", version=1,
           parameters={"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,"
                                   "incremental"}, default="false"),
    _field("db", "string"), _field("sequence", "string", optional=True), _field("ts_us", "int64", optional=True),
    _field("ts_ns", "int64", optional=True), _field("schema", "string"), _field("table", "string"),
    _field("txId", "int64", optional=True), _field("lsn", "int64", optional=True),
    _field("xmin", "int64", optional=True), _field("origin", "string", optional=True),
    _field("origin_lsn", "int64", optional=True)],
    "optional": False, "name": "io.debezium.connector.postgresql.Source", "version": 1, "field": "source"}
VALUE_SCHEMA = {"type": "struct", "fields": [
    {"type": "struct", "fields": ROW_SCHEMA, "optional": True, "name": "cdc.public.orders.Value", "field": "before"},
    {"type": "struct", "fields": ROW_SCHEMA, "optional": True, "name": "cdc.public.orders.Value", "field": "after"},
    SOURCE_SCHEMA,
    {"type": "struct", "fields": [_field("id", "string"), _field("total_order", "int64"),
                                  _field("data_collection_order", "int64")],
     "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
    _field("op", "string"), _field("ts_ms", "int64", optional=True), _field("ts_us", "int64", optional=True),
    _field("ts_ns", "int64", optional=True)],
    "optional": False, "name": "cdc.public.orders.Envelope", "version": 2}
KEY_SCHEMA = {"type": "struct", "fields": [_field("region", "string"), _field("order_id", "int64")],
              "optional": False, "name": "cdc.public.orders.Key"}


def _decimal(cents: int) -> str:
    """decimal.handling.mode=precise: the base64 of the unscaled value's big-endian two's complement bytes."""
    return base64.b64encode(cents.to_bytes((cents.bit_length() + 8) // 8, "big", signed=True)).decode()


def _row(region: str, order_id: int, cents: int, note: str | None, description: str) -> dict[str, Any]:
    return {"region": region, "order_id": order_id, "amount": _decimal(cents),
            "placed_at": "2026-01-02T03:04:05.678000Z", "note": note, "description": description}


def _event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int) -> dict[str, Any]:
    ts_ms = 1_795_000_000_000
    source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "cdc", "ts_ms": ts_ms,
              "snapshot": "first" if op == "r" else "false", "db": "microbatch", "sequence": f'[null,"{lsn}"]',
              "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000, "schema": "public", "table": "orders",
              "txId": 750 + lsn % 100, "lsn": lsn, "xmin": None, "origin": None, "origin_lsn": None}
    return {"before": before, "after": after, "source": source, "transaction": None, "op": op,
            "ts_ms": ts_ms + 5, "ts_us": (ts_ms + 5) * 1000, "ts_ns": (ts_ms + 5) * 1_000_000}


EVENTS = [
    ("eu", 1, _event("r", None, _row("eu", 1, 1234, None, "x" * 9600), 23_456_000)),
    ("us", 7, _event("r", None, _row("us", 7, -123456789012, "big", "y" * 9600), 23_456_000)),
    ("eu", 2, _event("c", None, _row("eu", 2, 10, "new", "short"), 23_457_100)),
    ("eu", 1, _event("u", None, _row("eu", 1, 9999, "paid", "__debezium_unavailable_value"), 23_457_300)),
    ("eu", 2, _event("d", _row("eu", 2, 10, "new", "short"), None, 23_457_500)),
    ("eu", 2, None),  # the tombstone after the delete
]


def _records(schemas: bool) -> tuple[list[bytes | None], list[bytes | None]]:
    def wrapped(schema: dict[str, Any], payload: dict[str, Any]) -> bytes:
        return json.dumps({"schema": schema, "payload": payload} if schemas else payload).encode()

    keys = [wrapped(KEY_SCHEMA, {"region": region, "order_id": order_id}) for region, order_id, _ in EVENTS]
    values = [None if event is None else wrapped(VALUE_SCHEMA, event) for _, _, event in EVENTS]
    return keys, values


def _sample(side: str, datas: list[bytes | None], change_stream: bool = False) -> Sample:
    return Sample(side, datas, set(), NOW, change_stream=change_stream)


@pytest.mark.parametrize("schemas", [True, False])
def test_change_events_look_like_debezium_and_nothing_else_does(schemas: bool) -> None:
    keys, values = _records(schemas)
    assert DebeziumFormat.looks_like(_sample("value", values))
    assert not DebeziumFormat.looks_like(_sample("key", keys))  # a key alone is any JSON object
    assert DebeziumFormat.looks_like(_sample("key", keys, change_stream=True))
    plain = [json.dumps({"id": 1, "op": "c", "before": None}).encode()]  # no source
    assert not DebeziumFormat.looks_like(_sample("value", [*values, *plain]))
    assert not DebeziumFormat.looks_like(_sample("value", [None, None]))
    assert not DebeziumFormat.looks_like(_sample("value", [b"not json"]))


def test_the_schema_part_gives_exact_types() -> None:
    keys, values = _records(schemas=True)
    value = DebeziumFormat.infer(_sample("value", values))
    assert value.spec == {"format": "debezium", "fields": {
        "region": "string", "order_id": "bigint", "amount": "decimal(12,2)", "placed_at": "timestamp",
        "note": "string", "description": "string"}}
    assert [(c.name, c.spark) for c in value.columns] == [
        ("region", "string"), ("order_id", "bigint"), ("amount", "decimal(12,2)"), ("placed_at", "timestamp"),
        ("note", "string"), ("description", "string"), ("__op", "string"), ("__lsn", "bigint")]
    assert value.upsert is not None and value.upsert.order_by == "__lsn" and not value.notes
    key = DebeziumFormat.infer(_sample("key", keys, change_stream=True))
    assert key.spec == {"format": "debezium", "fields": {"region": "string", "order_id": "bigint"}}
    assert key.keys == ("region", "order_id") and key.upsert is None


@pytest.mark.parametrize(("field_schema", "declared"), [
    (_field("n", "int32"), "int"), (_field("n", "int16"), "smallint"), (_field("n", "float64"), "double"),
    (_field("n", "boolean"), "boolean"),
    (_field("n", "bytes", name="org.apache.kafka.connect.data.Decimal", parameters={"scale": "3"}), "decimal(38,3)"),
    (_field("n", "int64", name="io.debezium.time.MicroTimestamp"), {"type": "timestamp_ntz", "unit": "us"}),
    (_field("n", "int64", name="io.debezium.time.Timestamp"), {"type": "timestamp_ntz", "unit": "ms"}),
    (_field("n", "int32", name="io.debezium.time.Date"), "date"),
])
def test_debeziums_logical_types(field_schema: dict[str, Any], declared: object) -> None:
    values = {"int32": 20_000, "int16": 1, "float64": 1.5, "boolean": True, "bytes": _decimal(12345),
              "int64": 1_795_000_000_000_000}
    value = values[field_schema["type"]]
    schema = {**VALUE_SCHEMA, "fields": [{"type": "struct", "fields": [field_schema], "optional": True,
                                          "field": "after"}, *VALUE_SCHEMA["fields"][2:]]}
    event = json.dumps({"schema": schema, "payload": _event("c", None, {"n": value}, 1)}).encode()
    side = DebeziumFormat.infer(_sample("value", [event]))
    assert side.spec is not None and side.spec["fields"] == {"n": declared}


def test_without_a_schema_part_the_values_say_the_types_and_a_base64_decimal_is_noted() -> None:
    keys, values = _records(schemas=False)
    value = DebeziumFormat.infer(_sample("value", values))
    assert value.spec == {"format": "debezium", "fields": {
        "region": "string", "order_id": "bigint", "amount": "string", "placed_at": "timestamp",
        "note": "string", "description": "string"}}
    assert len(value.notes) == 1 and value.notes[0].startswith("value.amount: base64 text, declared a string")
    key = DebeziumFormat.infer(_sample("key", keys, change_stream=True))
    assert key.spec == {"format": "debezium", "fields": {"region": "string", "order_id": "bigint"}}


def _tutorial_sink() -> dict[str, Any]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "your-own-pipeline.md").read_text()
    block = text.split("cat > ./include/pipelines/orders_cdc.yaml <<'SPEC'\n", 1)[1].split("\nSPEC\n", 1)[0]
    return yaml.safe_load(block)


def test_new_from_topic_writes_the_tutorials_cdc_spec(tmp_path: Path) -> None:
    keys, values = _records(schemas=True)
    written, inference = new_pipeline_from_sample("orders_cdc", TOPIC, keys, values, root=tmp_path, now=NOW)
    spec = load_spec(written["spec"])
    tutorial = _tutorial_sink()
    assert inference.spec["source"]["key"] == tutorial["source"]["key"]
    assert inference.spec["source"]["value"] == tutorial["source"]["value"]
    (sink,) = inference.spec["sinks"]
    (expected,) = tutorial["sinks"]
    shape = ("type", "columns", "keys", "order_by", "delete_column", "unavailable_value")
    assert {k: sink[k] for k in shape} == {k: expected[k] for k in shape}
    assert " ".join(sink["sql"].split()) == " ".join(expected["sql"].split())
    assert inference.sink_columns == expected["columns"]
    (loaded,) = spec.sinks
    assert loaded.type == "postgres_upsert" and list(loaded.keys) == ["region", "order_id"]
    lines = inference.summary(TOPIC)
    assert lines[1].startswith("value: debezium: 5 change event(s), typed by the schema part of 5, 6 field(s)")
    assert "value.amount (decimal(12,2))  ->  amount numeric" in " ".join(lines)
    loader = importlib.util.spec_from_file_location("generated_orders_cdc", written["test"])
    assert loader is not None and loader.loader is not None
    generated = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(generated)
    generated.test_the_spec_loads_and_the_query_gives_the_sink_columns()


def test_a_change_stream_without_a_primary_key_is_appended() -> None:
    _, values = _records(schemas=False)
    inference = infer_pipeline("orders_cdc", TOPIC, [None] * len(values), values, now=NOW)
    (sink,) = inference.spec["sinks"]
    assert sink["type"] == "postgres_append" and "__op" in sink["columns"]
    assert inference.summary(TOPIC)[-1].startswith(f"the key of {TOPIC} names no primary key column")
