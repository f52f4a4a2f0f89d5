"""The `avro` format on real services (issue 47): Apicurio Registry (its Confluent-compatible API), records written by
confluent-kafka's `AvroSerializer` (the Confluent wire format), decoded by the platform on the suite's Spark Connect
server. Each expectation is computed here with fastavro (`schemaless_reader` with the writer and the reader schema),
not with Spark: two interleaved schema versions (v2 adds a field with a default), the hazards (an unknown schema id,
plain Avro without the header, a truncated payload, a value shorter than the header) as reasons and never rows, and
the Avro-to-Spark type table (`formats.avro.spark_type`) against the types `from_avro` really gives."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from datetime import UTC, date, datetime
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

V1 = {"type": "record", "name": "Payment", "namespace": "shop",
      "fields": [{"name": "payment_id", "type": "string"}, {"name": "amount_cents", "type": "long"},
                 {"name": "status", "type": ["null", "string"], "default": None},
                 {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
TYPES = {"type": "record", "name": "Everything", "namespace": "shop", "fields": [
    {"name": "flag", "type": "boolean"}, {"name": "small", "type": "int"}, {"name": "big", "type": "long"},
    {"name": "ratio", "type": "float"}, {"name": "share", "type": "double"}, {"name": "blob", "type": "bytes"},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at_micros", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
    {"name": "hash", "type": {"type": "fixed", "name": "Md5", "size": 4}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}]}},
    {"name": "maybe", "type": ["null", "Color"], "default": None}]}


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
        yield session
        session.stop()


def serialize(url: str, subject_topic: str, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
    return serializer(record, SerializationContext(subject_topic, MessageField.VALUE))


def oracle(data: bytes, writers: dict[int, dict], reader: dict) -> dict[str, Any]:
    """fastavro's decode of a wire-format value (header, then the payload) into the reader schema."""
    assert data[0] == 0
    (schema_id,) = struct.unpack(">I", data[1:5])
    return fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(writers[schema_id]),
                                      fastavro.parse_schema(reader))


def bound(spec: dict[str, Any], url: str, subject: str) -> Any:
    fmt = format_for(TypeAdapter(FormatSpecs).validate_python(spec))
    client = Registry(url)
    reader = client.version(subject, "latest")
    return fmt.bound(RegistrySchemas(subject, reader.version, reader.schema_id, reader.schema,
                                     client.subject_schemas(subject)))


def decode(spark: Any, data: list[bytes | None], value: Any) -> list[Any]:
    from pyspark.sql import functions as F

    records = spark.createDataFrame([(n, None, v) for n, v in enumerate(data)], "n int, key binary, value binary")
    decoded = decode_record(format_for(TypeAdapter(FormatSpecs).validate_python("raw")), value, F.col("key"),
                            F.col("value"))
    out = select_decoded(records, decoded, decoded.reason, "reason")
    return out.withColumn("ts", F.unix_micros("ts")).orderBy("n").collect()


def test_two_versions_decode_into_the_reader_schema_and_every_hazard_is_a_reason(registry, connect):
    topic = "payments"
    t0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
    good = []
    for i in range(12):
        record = {"payment_id": f"p{i}", "amount_cents": 100 * i - 300, "status": None if i % 3 == 0 else "ok",
                  "ts": t0.replace(second=i)}
        if i % 2:
            good.append(serialize(registry, topic, V2, {**record, "currency": f"C{i}"}))
        else:
            good.append(serialize(registry, topic, V1, record))
    client = Registry(registry)
    ids = {client.version(f"{topic}-value", v).schema_id: schema for v, schema in ((1, V1), (2, V2))}
    plain = io.BytesIO()
    fastavro.schemaless_writer(plain, fastavro.parse_schema(V1),
                               {"payment_id": "plain", "amount_cents": 1, "status": None, "ts": t0})
    unknown = b"\x00" + struct.pack(">I", 987654) + good[0][5:]
    hazards = {unknown: "value's schema id 987654 is not a schema of subject 'payments-value' this batch knows",
               plain.getvalue(): "value does not start with the magic byte 0",
               good[1][:-9]: "value (subject 'payments-value')'s Avro payload does not decode with its writer schema",
               b"\x00\x00\x01": "value is shorter than the 5-byte header"}
    data = [*good, None, *hazards]
    spec = {"format": "avro", "subject": f"{topic}-value",
            "fields": {"payment_id": "string", "amount": {"type": "bigint", "from": "amount_cents"},
                       "status": "string", "ts": "timestamp", "currency": "string"}}
    rows = decode(connect, data, bound(spec, registry, f"{topic}-value"))

    for row, value in zip(rows[:len(good)], good, strict=True):
        expected = oracle(value, ids, V2)
        assert row["reason"] is None
        assert (row["payment_id"], row["amount"], row["status"], row["currency"]) == (
            expected["payment_id"], expected["amount_cents"], expected["status"], expected["currency"])
        assert row["ts"] == int(expected["ts"].timestamp() * 1_000_000)
    assert {row["currency"] for row in rows[:len(good):2]} == {"EUR"}, "v1 records take v2's default"
    tombstone = rows[len(good)]
    assert tombstone["reason"] is None and tombstone["payment_id"] is None
    for row, (value, reason) in zip(rows[len(good) + 1:], hazards.items(), strict=True):
        assert row["reason"] is not None and row["reason"].startswith(reason), (value, row["reason"])
        assert row["payment_id"] is None and row["amount"] is None, "a bad record gives no row values"


def test_the_type_table_is_the_one_from_avro_reads(registry, connect):
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from microbatch.formats.avro import reader_fields

    topic = "everything"
    record = {"flag": True, "small": -7, "big": 2**40, "ratio": 0.5, "share": 1e-3, "blob": b"\x00\xff",
              "day": date(2024, 2, 29), "at_micros": datetime(2024, 3, 1, 10, 15, 30, 123456, tzinfo=UTC),
              "local": datetime(2024, 3, 1, 10, 15, 30), "price": Decimal("1234567890.12"),
              "id": "0b4f3d2e-1c8a-4e55-9a6f-5d2f1e0c9b7a", "color": "GREEN", "hash": b"abcd", "tags": ["x", "y"],
              "attrs": {"a": 1}, "address": {"city": "Lyon", "zip": None}, "maybe": "RED"}
    value = serialize(registry, topic, TYPES, record)
    table = reader_fields(json.dumps(TYPES))
    spec = {"format": "avro", "fields": {name: kind for name, kind in table.items()}, "subject": f"{topic}-value"}
    fmt = bound(spec, registry, f"{topic}-value")
    records = connect.createDataFrame([(0, None, value)], "n int, key binary, value binary")
    decoded = decode_record(format_for(TypeAdapter(FormatSpecs).validate_python("raw")), fmt, F.col("key"),
                            F.col("value"))
    out = select_decoded(records, decoded, decoded.reason, "reason").withColumn("at_micros", F.unix_micros("at_micros"))
    spark_types = {f.name: f.dataType.simpleString() for f in select_decoded(records, decoded, decoded.reason,
                                                                            "reason").schema.fields}
    from_avro_types = {f.name: f.dataType.simpleString() for f in connect.createDataFrame(
        [(value[5:],)], "payload binary").select(from_avro("payload", json.dumps(TYPES)).alias("r"))
        .select("r.*").schema.fields}
    assert from_avro_types == table, "the documented table is what Spark's from_avro gives"
    assert {name: spark_types[name] for name in table} == table
    row = out.collect()[0]
    assert row["reason"] is None
    expected = oracle(value, {Registry(registry).version(f"{topic}-value", 1).schema_id: TYPES}, TYPES)
    assert row["big"] == expected["big"] and row["price"] == expected["price"] and row["day"] == expected["day"]
    assert row["id"] == str(expected["id"]) and row["color"] == "GREEN" and bytes(row["hash"]) == b"abcd"
    assert row["tags"] == ["x", "y"] and row["attrs"] == {"a": 1} and row["address"]["city"] == "Lyon"
    assert row["at_micros"] == int(expected["at_micros"].timestamp()) * 1_000_000 + expected["at_micros"].microsecond
    assert row["local"] == expected["local"]


EPOCHS = {"type": "record", "name": "Event", "namespace": "t", "fields": [
    {"name": "id", "type": "string"}, {"name": "ts_ms", "type": "long"}, {"name": "when", "type": ["null", "string"]}]}


def test_an_avro_long_of_epoch_milliseconds_and_a_string_in_a_pattern_read_as_timestamps(registry, connect):
    """`{type: timestamp, unit: ms}` over a plain Avro long and `{format: ...}` over a string (issue 59): the
    columns fastavro's decode gives, converted here in Python; a number beyond year 9999 or a string not in the
    pattern is a dead letter's reason naming the field; the reader check refuses a unit over a double."""
    topic = "epochs"
    records = [{"id": "a", "ts_ms": 1732870000123, "when": "29/11/2026 08:00:01"},
               {"id": "b", "ts_ms": -1000, "when": None},
               {"id": "c", "ts_ms": 253_402_300_800_000, "when": "2026-11-29"}]
    data = [serialize(registry, topic, EPOCHS, r) for r in records]
    spec = {"format": "avro", "subject": f"{topic}-value",
            "fields": {"id": "string", "ts": {"type": "timestamp", "unit": "ms", "from": "ts_ms"},
                       "at": {"type": "timestamp", "format": "dd/MM/yyyy HH:mm:ss", "from": "when"}}}
    connect.conf.set("spark.sql.session.timeZone", "UTC")
    rows = decode(connect, data, bound(spec, registry, f"{topic}-value"))
    ids = {Registry(registry).version(f"{topic}-value", 1).schema_id: EPOCHS}
    first, second = (oracle(v, ids, EPOCHS) for v in data[:2])
    assert (rows[0]["id"], rows[0]["ts"], rows[0]["reason"]) == ("a", first["ts_ms"] * 1000, None)
    at = datetime.strptime(first["when"], "%d/%m/%Y %H:%M:%S").replace(tzinfo=UTC).timestamp()
    assert rows[0]["at"] == datetime.fromtimestamp(at)  # PySpark gives a timestamp as the process's local time
    assert (rows[1]["ts"], rows[1]["at"], rows[1]["reason"]) == (second["ts_ms"] * 1000, None, None)
    assert rows[2]["reason"] == ("value field 'ts' is not a timestamp in epoch milliseconds; value field 'at' is not a "
                                 "timestamp in the format 'dd/MM/yyyy HH:mm:ss'")
    wrong = {**spec, "fields": {"ts": {"type": "timestamp", "format": "dd/MM/yyyy", "from": "ts_ms"}}}
    problem = format_for(TypeAdapter(FormatSpecs).validate_python(wrong)).reader_problem(
        json.dumps(EPOCHS), "value", f"{topic}-value", 1)
    assert problem is not None and problem.startswith("value.fields.ts:") and "format pattern" in problem, problem
