"""The `debezium` format with `converter: avro` on real services (issue 65): Apicurio Registry (its Confluent-compatible
API), Debezium-shaped change events (the envelope and key schemas Confluent's AvroConverter registers for a Postgres
table, its `connect.*` attributes included) written by confluent-kafka's `AvroSerializer`, decoded by the platform on
the suite's Spark Connect server. Each expectation is computed here from fastavro's decode of the same bytes and
Python's own reading of Debezium's encodings (a decimal's logical type, ZonedTimestamp's ISO text, MicroTimestamp's
epoch microseconds, Date's days, bytes), not with Spark: c, r, u and d events of two envelope versions (the second
after a column was added: the first's events take its default), a tombstone, a record key that differs from its row,
and the hazards (an unknown op, a truncate, no row image, no source.lsn, another magic byte, an unknown
schema id, a truncated payload) as reasons; the reader check refuses what the row's schema does not hold."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from pydantic import TypeAdapter

from microbatch.formats.base import RegistrySchemas
from microbatch.formats.record import decode_record, select_decoded
from microbatch.formats.registry import FormatSpecs, format_for
from microbatch.formats.schema_registry import Registry

pytestmark = pytest.mark.integration

TOPIC = "dbserver1.inventory.orders"
DECIMAL = {"type": "bytes", "scale": 2, "precision": 10, "connect.version": 1,
           "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
           "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal"}
VALUE = {"type": "record", "name": "Value", "namespace": TOPIC, "connect.name": f"{TOPIC}.Value", "fields": [
    {"name": "id", "type": {"type": "int", "connect.default": 0}},
    {"name": "customer", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": ["null", DECIMAL], "default": None},
    {"name": "placed_at", "type": ["null", {"type": "string", "connect.version": 1,
                                            "connect.name": "io.debezium.time.ZonedTimestamp"}], "default": None},
    {"name": "created", "type": ["null", {"type": "long", "connect.version": 1,
                                          "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None},
    {"name": "day", "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}],
     "default": None},
    {"name": "code", "type": ["null", "bytes"], "default": None}]}
VALUE2 = {**VALUE, "fields": [*VALUE["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
"""The row after `ALTER TABLE ... ADD COLUMN note text`: the envelope's second version."""
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
          "connect.name": "io.debezium.connector.postgresql.Source", "fields": [
              {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
              {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
              {"name": "snapshot", "type": [{"type": "string", "connect.version": 1, "connect.parameters": {
                  "allowed": "true,last,false,incremental"}, "connect.default": "false",
                  "connect.name": "io.debezium.data.Enum"}, "null"], "default": "false"},
              {"name": "db", "type": "string"}, {"name": "schema", "type": "string"},
              {"name": "table", "type": "string"},
              {"name": "txId", "type": ["null", "long"], "default": None},
              {"name": "lsn", "type": ["null", "long"], "default": None},
              {"name": "xmin", "type": ["null", "long"], "default": None}]}
def envelope(value: dict[str, Any]) -> dict[str, Any]:
    """The envelope of a row's record `value`, as the AvroConverter registers it (`before` defines the record)."""
    block = {"type": "record", "name": "block", "namespace": "event", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"}]}
    return {"type": "record", "name": "Envelope", "namespace": TOPIC, "connect.name": f"{TOPIC}.Envelope",
            "connect.version": 1, "fields": [
                {"name": "before", "type": ["null", value], "default": None},
                {"name": "after", "type": ["null", "Value"], "default": None},
                {"name": "source", "type": SOURCE}, {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "transaction", "type": ["null", block], "default": None}]}


ENVELOPE, ENVELOPE2 = envelope(VALUE), envelope(VALUE2)
KEY = {"type": "record", "name": "Key", "namespace": TOPIC, "connect.name": f"{TOPIC}.Key",
       "fields": [{"name": "id", "type": {"type": "int", "connect.default": 0}}]}
FIELDS = {"id": "int", "customer": "string", "amount": "decimal(10,2)", "placed_at": "timestamp",
          "created": {"type": "timestamp_ntz", "unit": "us"}, "day": "date", "code": "binary", "note": "string"}
EPOCH = datetime(1970, 1, 1)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from microbatch.dev.registry import SchemaRegistry

    with SchemaRegistry(tmp_path_factory.mktemp("registry")) as running:
        yield running.url


@pytest.fixture(scope="module")
def connect(spark_connect) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from microbatch.phases.stage import connect_client_scope

    with connect_client_scope():
        session = SparkSession.builder.remote(spark_connect.remote).create()
        session.conf.set("spark.sql.session.timeZone", "UTC")
        yield session
        session.stop()


def serialize(url: str, schema: dict[str, Any], record: dict[str, Any] | None, side: str) -> bytes | None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    if record is None:
        return None
    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
    field = MessageField.KEY if side == "key" else MessageField.VALUE
    return serializer(record, SerializationContext(TOPIC, field))


def row(i: int, customer: str | None, amount: str | None, *, day: int | None = 19_700) -> dict[str, Any]:
    return {"id": i, "customer": customer, "amount": None if amount is None else Decimal(amount),
            "placed_at": f"2026-11-2{i}T10:15:30.{i:06d}Z", "created": 1_764_000_000_000_000 + i * 1_000_001,
            "day": day, "code": bytes([i, 0, 255])}


def event(op: str, before: dict | None, after: dict | None, lsn: int | None, ts_ms: int) -> dict[str, Any]:
    source = {"version": "3.0.0.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": ts_ms,
              "snapshot": "true" if op == "r" else "false", "db": "shop", "schema": "inventory", "table": "orders",
              "txId": 7, "lsn": lsn, "xmin": None}
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts_ms + 5, "transaction": None}


def oracle(data: bytes, writers: dict[int, dict[str, Any]], reader: dict[str, Any]) -> dict[str, Any]:
    """fastavro's decode of a wire-format value (header, then the payload) with its writer schema into `reader`."""
    assert data[0] == 0
    (schema_id,) = struct.unpack(">I", data[1:5])
    return fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(writers[schema_id]),
                                      fastavro.parse_schema(reader))


def expected_row(envelope: dict[str, Any]) -> dict[str, Any]:
    """The columns Debezium's encodings say, read here in Python from fastavro's decode."""
    image = envelope["before"] if envelope["op"] == "d" else envelope["after"]
    placed = datetime.fromisoformat(image["placed_at"])
    return {"id": image["id"], "customer": image["customer"], "amount": image["amount"],
            "placed_at": (placed - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1),
            "created": EPOCH + timedelta(microseconds=image["created"]),
            "day": None if image["day"] is None else date(1970, 1, 1) + timedelta(days=image["day"]),
            "code": image["code"], "note": image["note"],
            "__op": envelope["op"], "__deleted": envelope["op"] == "d", "__lsn": envelope["source"]["lsn"],
            "__source_ts": envelope["source"]["ts_ms"] * 1000}


def bound(spec: dict[str, Any], url: str, subject: str) -> Any:
    fmt = format_for(TypeAdapter(FormatSpecs).validate_python(spec))
    client = Registry(url)
    reader = client.version(subject, "latest")
    assert fmt.reader_problem(reader.schema, subject.rsplit("-", 1)[1], subject, reader.version) is None
    return fmt.bound(RegistrySchemas(subject, reader.version, reader.schema_id, reader.schema,
                                     client.subject_schemas(subject)))


def test_debezium_avro_events_decode_as_the_json_converter_s_do_and_every_hazard_is_a_reason(registry, connect):
    from pyspark.sql import functions as F

    one, two = row(1, "ada", "12.50"), row(2, None, "-12345678.90", day=-3)
    changes = [(1, ENVELOPE, event("r", None, one, 100, 1_764_000_000_000)),
               (2, ENVELOPE, event("c", None, two, 200, 1_764_000_001_000)),
               (2, ENVELOPE, event("d", two, None, 400, 1_764_000_003_000)),
               (1, ENVELOPE2, event("u", {**one, "note": None}, {**one, "customer": "ada l.", "note": "gift",
                                                                 "amount": Decimal("99999999.99")}, 300,
                                    1_764_000_002_000)),
               (3, ENVELOPE2, event("c", None, {**row(3, None, None, day=None), "note": "é"}, 500, 1_764_000_004_000))]
    good = [(serialize(registry, KEY, {"id": k}, "key"), serialize(registry, schema, e, "value"))
            for k, schema, e in changes]
    key3 = serialize(registry, KEY, {"id": 3}, "key")
    bad_events = {"value op 'x' is not one of c, r, u, d": event("x", None, one, 600, 1),
                  "value is a truncate (op t)": event("t", None, None, 601, 1),
                  "value has no after image for op 'c'": event("c", None, None, 602, 1),
                  "value has no before image for op 'd'": event("d", None, None, 603, 1),
                  "value has no source.lsn, which orders a key's changes": event("c", None, one, None, 1)}
    value = good[0][1]
    assert value is not None
    hazards = {
        **{reason: serialize(registry, ENVELOPE, e, "value") for reason, e in bad_events.items()},
        "value does not start with the magic byte 0": b"\x01" + value[1:],
        "value's schema id 987654 is not a schema of subject 'dbserver1.inventory.orders-value' this batch knows":
            b"\x00" + struct.pack(">I", 987654) + value[5:],
        "value (subject 'dbserver1.inventory.orders-value')'s Avro payload does not decode": value[:12],
        "key field(s) id differ from the change's row": good[1][1]}
    records = [*good, (key3, None), *[(serialize(registry, KEY, {"id": 1}, "key") if "key field" not in reason
                                       else key3, data) for reason, data in hazards.items()]]
    client = Registry(registry)
    writers = {client.version(f"{TOPIC}-value", v).schema_id: schema for v, schema in ((1, ENVELOPE), (2, ENVELOPE2))}
    value_fmt = bound({"format": "debezium", "converter": "avro", "fields": FIELDS}, registry, f"{TOPIC}-value")
    key_fmt = bound({"format": "debezium", "converter": "avro", "fields": {"id": "int"}}, registry, f"{TOPIC}-key")
    assert value_fmt.pins()["converter"] == "avro" and value_fmt.pins()["version"] == 2

    frame = connect.createDataFrame([(n, k, v) for n, (k, v) in enumerate(records)], "n int, key binary, value binary")
    decoded = decode_record(key_fmt, value_fmt, F.col("key"), F.col("value"))
    out = (select_decoded(frame, decoded, decoded.reason, "reason")
           .withColumn("placed_at", F.unix_micros("placed_at")).withColumn("__source_ts", F.unix_micros("__source_ts"))
           .orderBy("n").collect())
    columns = ["id", "customer", "amount", "placed_at", "created", "day", "code", "note", "__op", "__deleted", "__lsn",
               "__source_ts"]
    for got, (key, data) in zip(out[:len(good)], good, strict=True):
        assert data is not None and key is not None
        expected = expected_row(oracle(data, writers, ENVELOPE2))
        assert got["reason"] is None, got["reason"]
        assert {name: got[name] for name in columns} == expected
        assert got["key_id"] == oracle(key, {client.version(f"{TOPIC}-key", 1).schema_id: KEY}, KEY)["id"]
    assert out[1]["amount"] == Decimal("-12345678.90") and out[2]["__deleted"] and out[2]["id"] == 2
    assert [got["note"] for got in out[:len(good)]] == [None, None, None, "gift", "é"], "v1 takes v2's default"
    tombstone = out[len(good)]
    assert tombstone["reason"] is None and tombstone["key_id"] == 3
    assert all(tombstone[name] is None for name in columns), "a tombstone decodes to nulls"
    for got, reason in zip(out[len(good) + 1:], hazards, strict=True):
        assert got["reason"] is not None and got["reason"].startswith(reason), (reason, got["reason"])
        if not reason.startswith("key field"):  # the pair's check: the value itself reads
            assert got["__op"] is None and got["__lsn"] is None, "a bad record gives no change columns"


def test_the_reader_check_names_what_the_row_s_schema_does_not_hold():
    latest, key = json.dumps(ENVELOPE2), json.dumps(KEY)

    def problem(fields: dict[str, Any], reader: str = latest, side: str = "value") -> str | None:
        spec = {"format": "debezium", "converter": "avro", "fields": fields}
        fmt = format_for(TypeAdapter(FormatSpecs).validate_python(spec))
        return fmt.reader_problem(reader, side, f"{TOPIC}-{side}", 1)

    assert problem(FIELDS) is None and problem({"id": "int"}, key, "key") is None
    assert "unit: us" in str(problem({"created": "timestamp"}))
    assert "reads as decimal(10,2), not decimal(12,2)" in str(problem({"amount": "decimal(12,2)"}))
    assert "'total' is not a field of the row" in str(problem({"total": "int"}))
    wide = {**VALUE2, "fields": [{**f, "type": {**DECIMAL, "precision": 64}} if f["name"] == "amount" else f
                                 for f in VALUE2["fields"]]}
    assert "Spark cannot" in str(problem({"amount": "decimal(10,2)"}, json.dumps(envelope(wide))))
    assert "'note' is not a field of the row" in str(problem({"note": "string"}, json.dumps(ENVELOPE)))
    no_lsn = {**ENVELOPE, "fields": [f if f["name"] != "source" else {**f, "type": {
        **SOURCE, "fields": [s for s in SOURCE["fields"] if s["name"] != "lsn"]}} for f in ENVELOPE["fields"]]}
    assert "source has no long lsn" in str(problem({"id": "int"}, json.dumps(no_lsn)))
    assert "not a Debezium change event's envelope" in str(problem({"id": "int"}, key))
    bound_value = format_for(TypeAdapter(FormatSpecs).validate_python(
        {"format": "debezium", "converter": "avro", "fields": FIELDS})).bound(RegistrySchemas(
            f"{TOPIC}-value", 2, 3, latest, {2: json.dumps(ENVELOPE), 3: latest}))
    met = bound_value.pins({"key_schema_1": 4, "value_schema_2": 3, "value_schema_3": 0})["writers"]
    assert met == [2], "the key's writer counts are not the value's"
    with pytest.raises(ValueError, match="decimal_handling"):
        TypeAdapter(FormatSpecs).validate_python({"format": "debezium", "converter": "avro", "fields": FIELDS,
                                                  "decimal_handling": "string"})
