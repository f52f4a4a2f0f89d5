"""The `avro` format's pure parts (issue 47): the spec and its one-sentence refusals, the Avro-to-Spark type table
(`spark_type`; tests/integration/test_avro_decode.py checks it against Spark's own `from_avro`), the check of the
declared fields against a reader schema, and the reader schema's decode mark. No Spark, no registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from microbatch.config import load_spec
from microbatch.errors import SpecError, first_validation_error
from microbatch.formats.avro import DECODED_MARK, AvroFormat, field_problem, reader_with_mark, spark_type
from microbatch.formats.registry import FormatSpecs, format_for

SPECS = TypeAdapter(FormatSpecs)
READER = json.dumps({"type": "record", "name": "Payment", "fields": [
    {"name": "payment_id", "type": "string"}, {"name": "amount_cents", "type": "long"},
    {"name": "status", "type": ["null", "string"], "default": None},
    {"name": "either", "type": ["int", "string"]}]})


def avro(fields: dict, **extra: object) -> AvroFormat:
    fmt = format_for(SPECS.validate_python({"format": "avro", "fields": fields, **extra}))
    assert isinstance(fmt, AvroFormat)
    return fmt


def refusal(data: object) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        SPECS.validate_python(data)
    return first_validation_error(caught.value)


def test_the_type_table():
    assert [spark_type(t) for t in ("boolean", "int", "long", "float", "double", "bytes", "string")] == [
        "boolean", "int", "bigint", "float", "double", "binary", "string"]
    logical = [({"type": "int", "logicalType": "date"}, "date"),
               ({"type": "long", "logicalType": "timestamp-millis"}, "timestamp"),
               ({"type": "long", "logicalType": "timestamp-micros"}, "timestamp"),
               ({"type": "long", "logicalType": "local-timestamp-micros"}, "timestamp_ntz"),
               ({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}, "decimal(9,2)"),
               ({"type": "fixed", "name": "F", "size": 8, "logicalType": "decimal", "precision": 18}, "decimal(18,0)"),
               ({"type": "string", "logicalType": "uuid"}, "string"),
               ({"type": "string", "logicalType": "no-such-logical-type"}, "string")]
    assert [spark_type(schema) for schema, _ in logical] == [kind for _, kind in logical]
    nested = {"type": "record", "name": "A", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
        {"name": "again", "type": ["null", "E"]},
        {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}},
        {"name": "xs", "type": {"type": "array", "items": ["null", "long"]}},
        {"name": "m", "type": {"type": "map", "values": "double"}}]}
    assert spark_type(nested) == "struct<e:string,again:string,f:binary,xs:array<bigint>,m:map<string,double>>"
    with pytest.raises(ValueError, match="a union of several types other than null has no one Spark type"):
        spark_type(["int", "string"])
    with pytest.raises(ValueError, match=r"time-millis \(a time of day\) has no column type here"):
        spark_type({"type": "int", "logicalType": "time-millis"})
    with pytest.raises(ValueError, match="contains itself"):
        spark_type({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]})


def test_the_declared_fields_are_checked_against_the_reader_schema_in_one_sentence():
    where = "the reader schema (subject 'pay-value' version 3)"
    fmt = avro({"payment_id": "string", "amount": {"type": "bigint", "from": "amount_cents"}, "status": "string"})
    assert fmt.reader_problem(READER, "value", "pay-value", 3) is None
    assert field_problem(avro({"amount_cents": "int"}).spec, READER, "value", "pay-value", 1) == (
        "value.fields.amount_cents: the field 'amount_cents' of the reader schema (subject 'pay-value' version 1) "
        "reads as bigint, not int; declare `amount_cents: bigint`")
    # A later version: a type change first names pinning the reader version and the migrate path (issue 64).
    assert field_problem(avro({"amount_cents": "int"}).spec, READER, "value", "pay-value", 3) == (
        f"value.fields.amount_cents: the field 'amount_cents' of {where} reads as bigint, not int; if a newer "
        "version changed its type, pin the reader schema to the last version where it is int (`version: N` in "
        "source.value, docs/formats.md) and the sink keeps its column, or read it under a new name "
        "(`amount_cents_bigint: {type: bigint, from: amount_cents}` and a sink column of that name, which `microbatch "
        "migrate` adds: it never changes a column's type); else declare `amount_cents: bigint`")
    missing = avro({"merchant": "string"}).reader_problem(READER, "value", "pay-value", 3)
    assert missing == (f"value.fields.merchant: 'merchant' is not a field of {where}; its fields are payment_id, "
                       "amount_cents, status, either; declare one of them, or read another name with `from`")
    union = avro({"either": "string"}).reader_problem(READER, "value", "pay-value", 3)
    assert union is not None and union.startswith(f"value.fields.either: the field 'either' of {where} cannot be a "
                                                  "column: a union of several types")
    assert avro({"x": "string"}).reader_problem('"string"', "key", "pay-key", 1) == (
        "key: the reader schema (subject 'pay-key' version 1) cannot be read as columns: its schema is not an Avro "
        "record, so it has no fields to declare; read a string key with `key: text`")


def test_spec_refusals_name_the_field():
    assert refusal({"format": "avro"}) == ("avro.fields", "declare at least one field as `name: spark_sql_type`, "
                                                          "e.g. `payment_id: string`")
    field, message = refusal({"format": "avro", "fields": {"offset": "bigint"}})
    assert field == "avro.fields" and message.startswith("'offset' is the name of a record column; rename")
    assert "read the Avro field with `from`" in message
    field, message = refusal({"format": "avro", "fields": {"doc": "variant"}})
    assert field == "avro.fields.doc.type" and "instead of variant" in message
    assert refusal({"format": "avro", "fields": {"a": "int"}, "version": 0})[1].startswith(
        "0 is not a schema version; versions count from 1, or write `latest`")
    assert refusal({"format": "avro", "fields": {"a": "int"}, "schema_id": 3})[0] == "avro.schema_id"


def test_the_subject_follows_the_topic_or_is_named(tmp_path: Path):
    base = {"name": "p", "schedule": None, "job": {"transform": "spark_jobs.payments_example:transform"},
            "sinks": [{"name": "s", "type": "postgres_append", "table": "s", "columns": {"amount": "bigint"}}]}
    value = {"format": "avro", "fields": {"amount": "bigint"}}

    def load(source: dict):
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump({**base, "source": source}))
        return load_spec(path)

    spec = load({"topics": ["payments"], "value": value, "key": {"format": "avro", "fields": {"id": "string"}}})
    assert spec.source.value_format.subject("value", spec.source.topics) == "payments-value"
    assert spec.source.key_format.subject("key", spec.source.topics) == "payments-key"
    assert spec.source.decodes and spec.records_columns["key_id"] == "string"
    named = load({"topics": ["a", "b"], "value": {**value, "subject": "shared-value"}})
    assert named.source.value_format.subject("value", ["a", "b"]) == "shared-value"
    for source, reads in (({"topics": ["a", "b"]}, "several topics"), ({"topic_pattern": "pay.*"}, "a topic pattern")):
        with pytest.raises(SpecError) as caught:
            load({**source, "value": value})
        assert (f"value.subject: the source reads {reads}, so the TopicNameStrategy gives no one subject; name the "
                "subject of the schemas, e.g. `subject: orders-value`") in str(caught.value)


def test_the_reader_schema_carries_a_mark_that_only_a_decoded_record_fills():
    marked = json.loads(reader_with_mark(READER))
    assert [f["name"] for f in marked["fields"]][-1] == DECODED_MARK
    assert marked["fields"][-1] == {"name": DECODED_MARK, "type": "boolean", "default": True}
    assert marked["fields"][:-1] == json.loads(READER)["fields"]
