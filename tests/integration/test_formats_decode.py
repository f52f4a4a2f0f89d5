"""The formats decode a record's key and value on real Spark, in one column expression (issue 43, item 2).

Each expected value and reason is computed here from the bytes with Python's `json` module and plain checks, not
by the code under test: the declared types' rules (json.py's docstring) written again in Python."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest
from pydantic import TypeAdapter

from microbatch.formats.record import decode_record
from microbatch.formats.registry import FormatSpecs, format_for

pytestmark = pytest.mark.integration

FIELDS = {"s": "string", "i": "int", "b": "bigint", "d": "double", "flag": "boolean", "ts": "timestamp",
          "day": "date", "amount": "decimal(10,2)", "tags": "array<string>"}
REQUIRED = ["s", "b"]
BASE = {"s": "k", "b": 1}
WRONG = {  # for each declared type, values of another JSON type or out of its range
    "s": [5, True, ["x"]], "i": ["7", 1.5, 2**31, True], "b": ["1", 1.0, 2**63], "d": ["1.5", True],
    "flag": ["true", 1], "ts": ["yesterday", 1700000000], "day": ["29/02/2024", 20240229],
    "amount": ["12.34", 123456789.1, False], "tags": ["x", [1, "x"], {"a": "b"}],
}
GOOD = [
    {"s": "a", "i": 7, "b": 2**40, "d": 1.5, "flag": True, "ts": "2024-03-01T10:15:30Z", "day": "2024-02-29",
     "amount": 12.34, "tags": ["x", "y"], "extra": {"undeclared": 1}},
    {"s": "b", "b": -3},  # optional fields missing
    {"s": "c", "b": 2, "i": None, "tags": None, "ts": None},  # optional fields JSON null
    {"s": "é", "b": 3, "i": -2**31, "d": 3, "amount": 12.345, "tags": ["x", None], "ts": "2024-03-01T12:15:30.5+02:00"},
    {"s": "", "b": 2**63 - 1, "d": -1e-3, "amount": 1e2, "flag": False, "tags": []},
]
BAD_DOCUMENTS = [b"not json", b'{"s": "a", "b":', b"[1, 2]", b'"text"', b"null", b"42", b'{"s": "\xff", "b": 1}',
                 b"\xc3\x28"]
MISSING = [{"b": 1}, {"s": "x"}, {}, {"s": None, "b": 1}, {"s": "x", "b": None, "i": "wrong"}]


def values() -> list[bytes | None]:
    wrong = [json.dumps({**BASE, name: bad}).encode() for name, bads in WRONG.items() for bad in bads]
    return [*(json.dumps(v).encode() for v in [*GOOD, *MISSING]), *wrong, *BAD_DOCUMENTS, None]


def expected_field(kind: str, v: Any) -> tuple[bool, Any]:
    """(whether `v`, a JSON value from Python's json module, fits `kind`, and the value the column holds)."""
    number = isinstance(v, int | float) and not isinstance(v, bool)
    if kind == "string":
        return isinstance(v, str), v
    if kind in ("int", "bigint"):
        bits = 31 if kind == "int" else 63
        return isinstance(v, int) and not isinstance(v, bool) and -2**bits <= v < 2**bits, v
    if kind == "double":
        return number, float(v) if number else None
    if kind == "boolean":
        return isinstance(v, bool), v
    if kind == "timestamp":
        try:
            moment = datetime.fromisoformat(v)
        except (TypeError, ValueError):
            return False, None
        return True, (moment - datetime(1970, 1, 1, tzinfo=UTC)) // (datetime.resolution)
    if kind == "date":
        try:
            return True, date.fromisoformat(v)
        except (TypeError, ValueError):
            return False, None
    if kind == "decimal(10,2)":
        amount = Decimal(repr(v)).quantize(Decimal("0.01"), ROUND_HALF_UP) if number else None
        return amount is not None and abs(amount) < 10**8, amount
    assert kind == "array<string>"
    return isinstance(v, list) and all(x is None or isinstance(x, str) for x in v), v


def expected(data: bytes | None) -> tuple[dict[str, Any], str | None]:
    """The columns and the reason the json format must give for `data`."""
    nulls = dict.fromkeys(FIELDS)
    if data is None:
        return nulls, None
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return nulls, "value is not valid UTF-8"
    except ValueError:
        return nulls, "value is not JSON"
    if not isinstance(document, dict):
        return nulls, "value is not a JSON object"
    columns, problems = {}, []
    for name, kind in FIELDS.items():
        v = document.get(name)
        ok, typed = expected_field(kind, v) if v is not None else (True, None)
        columns[name] = typed if ok else None
        if name in REQUIRED and name not in document:
            problems.append(f"value lacks the required field '{name}'")
        elif name in REQUIRED and v is None:
            problems.append(f"value field '{name}' is null but required")
        elif not ok:
            article = "an" if kind[0] in "aeiou" else "a"
            problems.append(f"value field '{name}' is not {article} {kind}")
    return columns, "; ".join(problems) or None


def formats(key: object, value: object):
    adapter = TypeAdapter(FormatSpecs)
    return format_for(adapter.validate_python(key)), format_for(adapter.validate_python(value))


def decode(spark, keys: list[bytes | None], data: list[bytes | None], key: object, value: object) -> list[Any]:
    from pyspark.sql import functions as F

    records = spark.createDataFrame(list(enumerate(zip(keys, data, strict=True))),
                                    "n int, kv struct<key: binary, value: binary>").select("n", "kv.*")
    decoded = decode_record(*formats(key, value), F.col("key"), F.col("value"))
    columns = [(F.unix_micros(c) if name == "ts" else c).alias(name) for name, c in decoded.columns.items()]
    return records.select("n", "key", "value", *columns, decoded.reason.alias("reason")).orderBy("n").collect()


def test_json_values_decode_to_the_declared_types_and_bad_ones_name_the_field(spark):
    data = values()
    rows = decode(spark, [None] * len(data), data, "raw",
                  {"format": "json", "fields": FIELDS, "required": REQUIRED})
    assert len(rows) == len(data) > 40
    for row, raw in zip(rows, data, strict=True):
        columns, reason = expected(raw)
        assert row["value"] == (bytearray(raw) if raw is not None else None)  # the bytes stay as read
        assert {name: row[name] for name in FIELDS} == columns, raw
        assert row["reason"] == reason, raw
    reasons = [row["reason"] for row in rows]
    assert sum(r is None for r in reasons) == len(GOOD) + 1  # the good ones and the tombstone
    assert "value field 'amount' is not a decimal(10,2)" in reasons and "value field 'tags' is not an array<string>" \
        in reasons and "value field 'i' is not an int; value field 'b' is null but required" in reasons


def test_text_reads_utf8_and_names_the_column_of_bytes_that_are_not(spark):
    keys = [b"abc", "été".encode(), b"\xff\xfe", b"", None, b"ok"]
    data = [b"x", b"y", b"z", b"w", None, b"\xc3\x28"]
    rows = decode(spark, keys, data, "text", "raw")
    for row, key, value in zip(rows, keys, data, strict=True):
        try:
            text, reason = (key.decode("utf-8") if key is not None else None), None
        except UnicodeDecodeError:
            text, reason = None, "key is not valid UTF-8"
        assert (row["key_text"], row["reason"]) == (text, reason), key
        assert row["value"] == bytearray(value) if value is not None else row["value"] is None  # raw: as it is
    rows = decode(spark, keys, data, "text", "text")
    assert rows[5]["value_text"] is None and rows[5]["reason"] == "value is not valid UTF-8"
    assert rows[2]["reason"] == "key is not valid UTF-8"
    assert [r["value_text"] for r in rows[:4]] == ["x", "y", "z", "w"]


def test_a_json_key_decodes_into_prefixed_columns_beside_the_value(spark):
    keys = [json.dumps({"payment_id": "p1"}).encode(), b"p2", None]
    data = [json.dumps({"amount": 5}).encode(), json.dumps({"amount": "5"}).encode(), b"{}"]
    rows = decode(spark, keys, data, {"format": "json", "fields": {"payment_id": "string"}},
                  {"format": "json", "fields": {"amount": "bigint"}})
    assert [(r["key_payment_id"], r["amount"], r["reason"]) for r in rows] == [
        ("p1", 5, None), (None, None, "key is not JSON; value field 'amount' is not a bigint"), (None, None, None)]


def test_nested_types_are_checked_element_by_element_and_a_json_name_is_read_with_from(spark):
    fields = {"meta": "struct<a: int, b: map<string, double>>", "grid": "array<array<int>>", "any": "variant",
              "event_time": {"type": "string", "from": "event-time"}}
    documents = [
        {"meta": {"a": 1, "b": {"x": 1.5, "y": None}}, "grid": [[1, 2], [], None], "any": {"k": [1]},
         "event-time": "t"},
        {"meta": {"a": "1"}, "grid": [[1, "2"]], "any": None},
        {"meta": {"b": {"x": "no"}}, "grid": [1]},
        {"meta": [], "any": 3},
    ]
    rows = decode(spark, [None] * 4, [json.dumps(d).encode() for d in documents], "raw",
                  {"format": "json", "fields": fields})
    assert rows[0]["meta"].asDict() == {"a": 1, "b": {"x": 1.5, "y": None}}
    assert rows[0]["grid"] == [[1, 2], [], None] and rows[0]["event_time"] == "t" and rows[0]["reason"] is None
    assert json.loads(rows[0]["any"].toJson()) == {"k": [1]} and rows[3]["any"].toJson() == "3"
    assert rows[1]["reason"] == ("value field 'meta' is not a struct<a:int,b:map<string,double>>; "
                                 "value field 'grid' is not an array<array<int>>")
    assert rows[1]["any"] is None  # JSON null is null
    assert rows[2]["reason"] == ("value field 'meta' is not a struct<a:int,b:map<string,double>>; "
                                 "value field 'grid' is not an array<array<int>>")
    assert rows[3]["reason"] == "value field 'meta' is not a struct<a:int,b:map<string,double>>"
