"""The spec of a record's key or value format (issue 43, item 2): what `source.key`/`source.value` accept, and the
one sentence that refuses a spec, naming the field and what to do. Pure: no Spark. The decode on Spark is
tests/integration/test_formats_decode.py."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from microbatch.errors import first_validation_error
from microbatch.formats.fields import RESERVED_NAMES
from microbatch.formats.json import JsonFormat
from microbatch.formats.raw import RawFormat
from microbatch.formats.record import decoded_columns
from microbatch.formats.registry import FORMATS, FormatSpecs, format_for
from microbatch.formats.text import TextFormat
from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS

SPECS = TypeAdapter(FormatSpecs)


def refusal(data: object) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        SPECS.validate_python(data)
    return first_validation_error(caught.value)


def fmt(data: object):
    return format_for(SPECS.validate_python(data))


def test_each_format_name_is_a_tag_of_the_union_and_a_string_is_its_short_form():
    assert set(FORMATS) == {"raw", "text", "json", "avro", "debezium"}
    assert isinstance(fmt("raw"), RawFormat) and isinstance(fmt({"format": "raw"}), RawFormat)
    assert isinstance(fmt("text"), TextFormat)
    assert isinstance(fmt({"format": "json", "fields": {"a": "int"}}), JsonFormat)
    field, message = refusal({"format": "protobuf"})
    assert field == "format" and message.startswith("'protobuf' is not a format; use one of raw, text, json, avro")
    assert refusal({"fields": {}})[1].startswith("is missing; use one of")


def test_json_columns_are_the_declared_fields_in_spark_spelling_and_order():
    json_format = fmt({"format": "json", "fields": {
        "payment_id": "string", "amount_cents": "long", "price": "DECIMAL(10, 2)", "tags": "array<string>",
        "ts": {"type": "timestamp", "from": "eventTime"}, "meta": "struct<a: int, b: map<string, double>>"},
        "required": ["payment_id"]})
    assert json_format.columns() == {
        "payment_id": "string", "amount_cents": "bigint", "price": "decimal(10,2)", "tags": "array<string>",
        "ts": "timestamp", "meta": "struct<a:int,b:map<string,double>>"}
    assert json_format.spec.fields["ts"].json_name == "eventTime"
    assert fmt("raw").columns() == {} and fmt("text").columns() == {"text": "string"}


def test_an_unknown_spark_type_is_refused_naming_the_field_and_the_types_to_use():
    field, message = refusal({"format": "json", "fields": {"amount": "bigint2"}})
    assert field == "json.fields.amount.type"
    assert "'bigint2' is not a Spark SQL type" in message and "decimal(p,s)" in message and "bigint" in message
    for bad in ("map<int,string>", "decimal(40,2)", "array<int", "struct<>"):
        field, message = refusal({"format": "json", "fields": {"x": bad}})
        assert field == "json.fields.x.type" and "use one of" in message, bad
    field, message = refusal({"format": "json", "fields": {"x": "array<binary>"}})
    assert field == "json.fields.x.type" and message.startswith("JSON has no binary type; read the field as a string")


def test_a_required_field_that_is_not_declared_is_refused():
    field, message = refusal({"format": "json", "fields": {"payment_id": "string"}, "required": ["paymentid"]})
    assert field == "json.required"
    assert message == ("'paymentid' is not a declared field; declare it in fields or remove it from required")


def test_json_without_fields_is_refused_with_an_example():
    for data in ({"format": "json"}, {"format": "json", "fields": {}}, "json"):
        field, message = refusal(data)
        assert field == "json.fields" and "declare at least one field" in message and "payment_id: string" in message


@pytest.mark.parametrize("name", [*RECORD_COLUMNS, HEADERS_COLUMN, "Timestamp"])
def test_a_field_named_like_a_record_column_is_refused_with_a_rename(name):
    field, message = refusal({"format": "json", "fields": {name: "string"}})
    assert field == "json.fields"
    assert f"'{name}' is the name of a record column" in message
    assert f"payload_{name.lower()}: {{type: string, from: {name}}}" in message
    renamed = fmt({"format": "json", "fields": {f"payload_{name.lower()}": {"type": "string", "from": name}}})
    assert renamed.columns() == {f"payload_{name.lower()}": "string"}


def test_the_reserved_names_are_the_record_columns_of_the_contract():
    assert set(RESERVED_NAMES) == {"key", "value", "topic", "partition", "offset", "timestamp", "timestamp_type",
                                   "headers"}


def test_a_field_that_is_no_column_name_or_repeats_one_in_another_case_is_refused():
    field, message = refusal({"format": "json", "fields": {"payment-id": "string"}})
    assert field == "json.fields" and 'payment_id: {type: string, from: "payment-id"}' in message
    field, message = refusal({"format": "json", "fields": {"Amount": "int", "amount": "int"}})
    assert field == "json.fields" and "'Amount' and 'amount' differ only in case" in message


def test_unknown_keys_are_refused():
    field, _ = refusal({"format": "text", "encoding": "latin1"})
    assert field == "text.encoding"
    field, _ = refusal({"format": "json", "fields": {"a": {"type": "int", "path": "x"}}})
    assert field == "json.fields.a.path"


def test_a_key_column_is_prefixed_and_a_value_field_keeps_its_name():
    key = fmt({"format": "json", "fields": {"payment_id": "string"}})
    value = fmt({"format": "json", "fields": {"amount": "bigint"}})
    assert decoded_columns(key, value) == {"key_payment_id": "string", "amount": "bigint"}
    assert decoded_columns(fmt("text"), fmt("text")) == {"key_text": "string", "value_text": "string"}
    assert decoded_columns(fmt("raw"), fmt("raw")) == {}
    clashing = fmt({"format": "json", "fields": {"key_payment_id": "string"}})
    with pytest.raises(ValueError, match="'key_payment_id' would be the column 'key_payment_id'"):
        decoded_columns(key, clashing)


def test_pins_change_with_the_declared_fields_only():
    base = {"format": "json", "fields": {"a": "int", "b": "string"}, "required": ["a"]}
    pins = fmt(base).pins()
    assert pins["format"] == "json" and len(pins["fields_sha256"]) == 64
    assert fmt({**base, "fields": {"a": "integer", "b": "string"}}).pins() == pins  # the same type, spelled otherwise
    assert fmt({**base, "fields": {"a": "bigint", "b": "string"}}).pins() != pins
    assert fmt({**base, "required": []}).pins() != pins
    assert fmt({**base, "fields": {"a": {"type": "int", "from": "A"}, "b": "string"}}).pins() != pins
    assert fmt("raw").pins() == {"format": "raw"} and fmt("text").pins() == {"format": "text"}


def test_debezium_s_avro_converter_reads_through_the_registry_with_the_json_converter_s_columns():
    declared = {"fields": {"id": "int", "amount": "decimal(10,2)"}}
    json_fmt, avro_fmt = fmt({"format": "debezium", **declared}), fmt({"format": "debezium", "converter": "avro",
                                                                        **declared})
    assert not json_fmt.uses_registry and avro_fmt.uses_registry and avro_fmt.name == "debezium"
    assert avro_fmt.side_columns("value") == json_fmt.side_columns("value")
    assert avro_fmt.side_columns("key") == {"id": "int", "amount": "decimal(10,2)"}
    assert avro_fmt.subject("value", ["cdc.public.orders"]) == "cdc.public.orders-value"
    assert avro_fmt.subject("key", ["a", "b"]) is None
    named = fmt({"format": "debezium", "converter": "avro", "subject": "s", **declared})
    assert named.subject("key", ["a", "b"]) == "s"
    assert "name the registry schemas" in refusal({"format": "debezium", "subject": "s", **declared})[1]
    assert "drop decimal_handling" in refusal({"format": "debezium", "converter": "avro", "decimal_handling": "double",
                                               **declared})[1]
    assert "versions count from 1" in refusal({"format": "debezium", "converter": "avro", "version": 0, **declared})[1]
