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

from microbatch.formats import jvm
from microbatch.formats.record import decode_record, select_decoded
from microbatch.formats.registry import FormatSpecs, format_for

pytestmark = pytest.mark.integration

FIELDS = {"s": "string", "i": "int", "b": "bigint", "d": "double", "flag": "boolean", "ts": "timestamp",
          "day": "date", "amount": "decimal(10,2)", "tags": "array<string>"}
REQUIRED = ["s", "b"]
BASE = {"s": "k", "b": 1}
WRONG = {  # for each declared type, values of another JSON type or out of its range
    "s": [5, True, ["x"], {"a": 1}, 1e5, -1.5, False],
    "i": ["7", 1.5, 2**31, True, 1e2], "b": ["1", 1.0, 2**63, "", -1e0],
    "d": ["1.5", True, "NaN"],
    "flag": ["true", 1], "ts": ["yesterday", 1700000000, "", "2024-13-01T00:00:00Z"],
    "day": ["29/02/2024", 20240229, ""],
    "amount": ["12.34", 123456789.1, False, 99999999.995], "tags": ["x", [1, "x"], {"a": "b"}],
}
GOOD = [
    {"s": "a", "i": 7, "b": 2**40, "d": 1.5, "flag": True, "ts": "2024-03-01T10:15:30Z", "day": "2024-02-29",
     "amount": 12.34, "tags": ["x", "y"], "extra": {"undeclared": 1}},
    {"s": "b", "b": -3},  # optional fields missing
    {"s": "c", "b": 2, "i": None, "tags": None, "ts": None},  # optional fields JSON null
    {"s": "é", "b": 3, "i": -2**31, "d": 3, "amount": 12.345, "tags": ["x", None], "ts": "2024-03-01T12:15:30.5+02:00"},
    {"s": "", "b": 2**63 - 1, "d": -1e-3, "amount": 1e2, "flag": False, "tags": []},
    # strings a number, true, false, an array or an object could have written (the fast path leaves them to the
    # strict one), and timestamps with a space or another offset
    {"s": "12345", "b": 4, "ts": "2024-03-01 10:15:30+01:00", "tags": ["true", "[x"]},
    {"s": "-1.5e3", "b": 5, "d": 0.1, "amount": 12345678.994, "day": "2024-01-01"},
    {"s": "true", "b": 6, "d": 1.7976931348623157e308}, {"s": "[x", "b": 7}, {"s": "{", "b": 8}, {"s": "-", "b": 9},
]
BAD_DOCUMENTS = [b"not json", b'{"s": "a", "b":', b"[1, 2]", b'"text"', b"null", b"42", b'{"s": "\xff", "b": 1}',
                 b"\xc3\x28", b"", b"  ",
                 b'{"s": "\\ud800", "b": 1}', b'{"s": "a", "b": 1, "x": ["\\udc00"]}', b"{'s': 'a', 'b': 1}",
                 b'{"s": "a", "b": 1, "d": NaN}', b'{"s": "a", "b": 1, "d": Infinity}', b'{"s": "a", "b": 01}',
                 b'{"s": "\\ud83d\\ude00", "b": 1, "amount": 0.125, "d": 123456789012345678901234567890}']
REPEATED = [  # a repeated key is no error: its last value is the field's, at any depth
    b'{"s": "a", "b": 1, "s": "b"}', b'{"s": "a", "b": 1, "x": {"y": 1, "y": 2}}', b'{"s": "a", "b": "x", "b": 2}',
    b'{"s": "a", "b": 2, "b": "x"}', b'{"s": 5, "b": 1, "s": "c", "tags": ["x"], "tags": [1]}',
    b'{"s": "a", "b": 1, "b": null}',
    b'{"s": "a", "b": 1, "tags": [{"k": 1, "k": 2}]}', b'{"s": "\\\\ud800", "b": 1, "s": "x"}',
    b'{"s": "\\ud800", "b": 1, "s": "x"}',  # a lone surrogate is not JSON, though a later value replaces it
]
MISSING = [{"b": 1}, {"s": "x"}, {}, {"s": None, "b": 1}, {"s": "x", "b": None, "i": "wrong"}]


def values() -> list[bytes | None]:
    wrong = [json.dumps({**BASE, name: bad}).encode() for name, bads in WRONG.items() for bad in bads]
    return [*(json.dumps(v).encode() for v in [*GOOD, *MISSING]), *wrong, *BAD_DOCUMENTS, *REPEATED, None]


def _last_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object as the json format reads it: a repeated key's last value, but each value checked (`_unicode`)."""
    for pair in pairs:
        _unicode(list(pair))
    return dict(pairs)


def _refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def _unicode(v: Any) -> None:
    """ValueError if `v` holds a string (or key) with a lone surrogate, which Python's json module reads."""
    for text in (v if isinstance(v, list) else [*v, *v.values()] if isinstance(v, dict) else [v]):
        if isinstance(text, str):
            text.encode("utf-8")
        elif isinstance(text, list | dict):
            _unicode(text)


def load(text: str) -> Any:
    """JSON as the json format reads it: a repeated key's last value, no NaN or Infinity, no lone surrogate (in a
    replaced value too); numbers exact."""
    document = json.loads(text, object_pairs_hook=_last_wins, parse_constant=_refuse, parse_float=Decimal)
    try:
        _unicode(document)
    except UnicodeEncodeError as exc:
        raise ValueError("a lone surrogate") from exc
    return document


def expected_field(kind: str, v: Any) -> tuple[bool, Any]:
    """(whether `v`, a JSON value from `load`, fits `kind`, and the value the column holds)."""
    number = isinstance(v, int | Decimal) and not isinstance(v, bool)
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
        amount = Decimal(v).quantize(Decimal("0.01"), ROUND_HALF_UP) if number else None
        return amount is not None and abs(amount) < 10**8, amount
    assert kind == "array<string>"
    return isinstance(v, list) and all(x is None or isinstance(x, str) for x in v), v


def expected(data: bytes | None) -> tuple[dict[str, Any], str | None]:
    """The columns and the reason the json format must give for `data`."""
    nulls = dict.fromkeys(FIELDS)
    if data is None:
        return nulls, None
    try:
        document = load(data.decode("utf-8"))
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


def decode(spark, keys: list[bytes | None], data: list[bytes | None], key: object, value: object,
           on_jvm: bool = False) -> list[Any]:
    """Each record's key, value, decoded columns (a timestamp as micros) and reason, by the built-in decode or (with
    `on_jvm`) by the formats' Java functions."""
    from pyspark.sql import functions as F

    records = spark.createDataFrame(list(enumerate(zip(keys, data, strict=True))),
                                    "n int, kv struct<key: binary, value: binary>").select("n", "kv.*")
    chosen = [fmt.on_jvm() if on_jvm else fmt for fmt in formats(key, value)]
    decoded = decode_record(*chosen, F.col("key"), F.col("value"))
    columns = [F.unix_micros(F.col(name)).alias(name) if name in ("ts", "key_ts") else name
               for name in decoded.columns]
    return select_decoded(records, decoded, decoded.reason, "reason").select(
        "n", "key", "value", *columns, "reason").orderBy("n").collect()


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
    # the good ones, the tombstone, the emoji, four of the repeated keys
    assert sum(r is None for r in reasons) == len(GOOD) + 2 + 4
    assert "value field 'amount' is not a decimal(10,2)" in reasons and "value field 'tags' is not an array<string>" \
        in reasons and "value field 'i' is not an int; value field 'b' is null but required" in reasons


ODD = [  # values whose decode the oracle above cannot tell (Spark's own casts), each also read by the strict path
    b'{"s": "a", "b": 1, "ts": "2024-03-01 10:15:30"}', b'{"s": "a", "b": 1, "ts": "2024-03-01"}',
    b'{"s": "a", "b": 1, "ts": "2024"}', b'{"s": "a", "b": 1, "ts": "2024-03"}',
    b'{"s": "a", "b": 1, "ts": " 2024-03-01"}', b'{"s": "a", "b": 1, "ts": "2024-03-01T10:15:30.123456789Z"}',
    b'{"s": "a", "b": 1, "ts": "2024-03-01T10:15:30+0530"}',
    b'{"s": "a", "b": 1, "ts": "2024-03-01T10:15:30 Europe/Paris"}', b'{"s": "a", "b": 1, "ts": 1700000000.5}',
    b'{"s": "a", "b": 1, "day": "2024-2-9"}', b'{"s": "a", "b": 1, "day": "2024-02-29T10:00:00"}',
    b'{"s": "a", "b": 1, "day": "2024"}', b'{"s": "a", "b": 1, "day": " 2024-02-29 "}', b'{"s": -0, "b": -0}',
    b'{"s": 1E5, "b": 1}', b'{"s": 1.0, "b": 1}', b'{"s": "1.", "b": 1}', b'{"s": "0x1F", "b": 1}',
    b'{"s": "a", "b": 1, "i": 2147483647, "d": 1e400}', b'{"s": "a", "b": 1, "d": 5e-324, "i": -2147483648}',
    b'{"s": "a", "b": 1, "d": 9007199254740993}', b'{"s": "a", "b": 1, "d": 0.30000000000000004}',
    b'{"s": "a", "b": 1, "d": 1e-400}', b'{"s": "a", "b": 1, "d": -0.0}',
    b'{"s": "a", "b": 1, "d": 123456789.123456789123}', b'{"s": "a", "b": 1, "amount": 0.005}',
    b'{"s": "a", "b": 1, "amount": 0.015}', b'{"s": "a", "b": 1, "amount": 1.5e-3}',
    b'{"s": "a", "b": 1, "amount": 12345678.995}', b'{"s": "a", "b": 1, "amount": 123456789012345678901234567890.5}',
    b'{"s": "a", "b": 1, "amount": 1e2}', b'{"s": "a", "b": 1, "amount": 1E-2}',
    b'{"s": "a", "b": 1, "amount": "1.5"}', b'{"s": "a\\"b", "b": 1}', b'{"s": "\\u0041\\u00e9", "b": 1}',
    b'{"S": "a", "b": 1}', b'{"s": "a", "b": 1} trailing', b'{"s": "a", "b": 1, "nested": {"s": 5, "b": "x"}}',
    b'{"s": "a", "b": 1, "tags": ["x", null], "flag": null}', b'{"s": "a", "b": 1, "s": 5}',
    b'{"b": 1, "b": 2, "s": "a"}', b'{"s": "a", "b": 1, "tags": []}', b'{ "s" : "a" , "b" : 1 }',
    b'{"s":"a","b":1,"i":1e2}', b'{"s": "a", "b": 1, "flag": "true"}',
]


def test_the_fast_path_decodes_as_the_strict_path(spark):
    """Each value, and the same value with one more declared field that is wrong (`zz`, which no fast path vouches
    for, so the strict path reads it), decode to the same columns; the reason only adds `zz`'s."""
    data = [*values(), *ODD]
    objects = [v for v in data if v is not None and v.lstrip().startswith(b"{")]
    forced = [b'{"zz": "x", ' + v.lstrip()[1:] if v.strip() != b"{}" else b'{"zz": "x"}' for v in objects]
    spec = {"format": "json", "fields": {**FIELDS, "zz": "int"}, "required": REQUIRED}
    rows = decode(spark, [None] * 2 * len(objects), [*objects, *forced], "raw", spec)
    whole = ("value is not valid UTF-8", "value is not JSON", "value is not a JSON object")
    for row, forced_row, raw in zip(rows[:len(objects)], rows[len(objects):], objects, strict=True):
        assert {n: row[n] for n in FIELDS} == {n: forced_row[n] for n in FIELDS}, raw
        wrong_zz = "value field 'zz' is not an int"
        assert forced_row["reason"] == (row["reason"] if row["reason"] in whole else
                                        "; ".join(r for r in (row["reason"], wrong_zz) if r)), raw


def test_the_jvm_decode_equals_the_built_in_one_on_every_value(spark):
    """Where the stage's Spark has the formats jar (this session has it, as spark-submit's and the local stack's
    Connect server have), a json spec of the types JsonDecoder.java takes decodes in its one pass: every value of
    the corpus above (each checked against the oracle by the built-in decode) gets the same columns and reason,
    as a value and as a key; a spec with a nested type keeps the built-in decode."""
    assert jvm.available(spark)
    fields = {name: kind for name, kind in FIELDS.items() if kind != "array<string>"}
    spec = {"format": "json", "fields": {**fields, "tiny": "tinyint", "small": "smallint",
                                         "local": "timestamp_ntz"}, "required": REQUIRED}
    assert formats("raw", spec)[1].on_jvm().jvm and not formats("raw", {**spec, "fields": FIELDS})[1].on_jvm().jvm
    data = [*values(), *ODD, b'{"s": "a", "b": 1, "tiny": 127, "small": -32768, "local": "2024-03-01 10:15:30"}',
            b'{"s": "a", "b": 1, "tiny": 128, "small": 32768, "local": "2024-03-01T10:15:30+01:00"}',
            b'{"s": "a", "b": 1, "tiny": -129, "small": 1.0, "local": "x"}']
    nones = [None] * len(data)
    built_in = decode(spark, nones, data, "raw", spec)
    on_jvm = decode(spark, nones, data, "raw", spec, on_jvm=True)
    assert sum(row["reason"] is None for row in on_jvm) > 20
    for jvm_row, row, raw in zip(on_jvm, built_in, data, strict=True):
        assert jvm_row.asDict() == row.asDict(), raw
    as_keys = decode(spark, data, nones, spec, "raw", on_jvm=True)
    assert [r.asDict() for r in as_keys] == [r.asDict() for r in decode(spark, data, nones, spec, "raw")]
    assert any(r["reason"] and r["reason"].startswith("key field") for r in as_keys)


def test_a_spark_without_the_formats_jar_decodes_with_the_built_in_functions(spark, monkeypatch, caplog):
    """A Spark that cannot load the Java class (here: a class name no jar has) is told apart by `jvm.available`,
    which says why in one line; the stage's read then decodes with the built-in functions, to the same rows."""
    from microbatch.phases.stage_records import DECODE_ERROR, decoded_records

    data = [b'{"s": "a", "b": 1, "ts": "2024-03-01T10:15:30Z"}', b'{"s": 5, "b": 1}', b"nope", None]
    records = spark.createDataFrame([(i, None, v) for i, v in enumerate(data)], "offset int, key binary, value binary")
    key, value = formats("raw", {"format": "json", "fields": {"s": "string", "b": "bigint", "ts": "timestamp"}})
    with_jar = decoded_records(records, key, value).orderBy("offset").collect()
    monkeypatch.setattr(jvm, "JSON_DECODER", "microbatch.formats.NoSuchDecoder")
    assert not jvm.available(spark)
    assert "this Spark has no microbatch formats jar" in caplog.text and "NoSuchDecoder" in caplog.text
    without = decoded_records(records, key, value).orderBy("offset").collect()
    assert [r.asDict() for r in without] == [r.asDict() for r in with_jar]
    assert [r[DECODE_ERROR] for r in without] == [None, "value field 's' is not a string", "value is not JSON", None]
    assert without[0]["ts"] is not None


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


EPOCH_FIELDS = {"b": "bigint", "ms": {"type": "timestamp", "unit": "ms"}, "sec": {"type": "timestamp", "unit": "s"},
                "us": {"type": "timestamp_ntz", "unit": "us"},
                "at": {"type": "timestamp", "format": "dd/MM/yyyy HH:mm:ss"},
                "day": {"type": "date", "format": "dd.MM.yyyy"}}
EPOCH_LAST = {"ms": 253_402_300_799_999, "sec": 253_402_300_799, "us": 253_402_300_799_999_999}
EPOCH_GOOD = [
    {"b": 1, "ms": 1732870000123, "sec": 1732870000, "us": "1732870000123456", "at": "29/11/2026 08:00:01",
     "day": "29.11.2026"},
    {"b": 2, "ms": "1732870000123", "sec": "-1", "us": 0, "at": None},  # strings of digits; JSON null; absent
    {"b": 3, "ms": -1000, **EPOCH_LAST, "at": "01/01/1970 00:00:00"},  # before 1970; the last numbers of year 9999
]
EPOCH_WRONG = {"ms": [1.5, "abc", True, "2026-11-29T08:00:00Z", 12345678901234567890, EPOCH_LAST["ms"] + 1, "",
                      " 12", "1e3", [1]],
               "sec": [-EPOCH_LAST["sec"] - 1, 1732870000.0], "us": ["0x10", {"a": 1}],
               "at": ["2026-11-29T08:00:00Z", 5, "29/11/2026", "32/11/2026 08:00:00"],
               "day": ["2026-11-29", "31.02.2026", 20261129]}


def epoch_expected(v: dict) -> tuple[dict, str | None]:
    """The oracle: each field's microseconds since the epoch (a date as itself) and the reason, in plain Python."""
    units = {"ms": 1000, "sec": 1_000_000, "us": 1}
    described = {"ms": "a timestamp in epoch milliseconds", "sec": "a timestamp in epoch seconds",
                 "us": "a timestamp_ntz in epoch microseconds",
                 "at": "a timestamp in the format 'dd/MM/yyyy HH:mm:ss'", "day": "a date in the format 'dd.MM.yyyy'"}
    columns: dict[str, Any] = {"b": v.get("b")}
    problems = []
    for name in ("ms", "sec", "us", "at", "day"):
        x, value = v.get(name), None
        if x is not None:
            if name in units:
                digits = str(x) if isinstance(x, int) and not isinstance(x, bool) else x if isinstance(x, str) else ""
                number = int(digits) if digits.lstrip("-").isdigit() and digits.strip() == digits else None
                last = EPOCH_LAST[name]
                value = number * units[name] if number is not None and -last <= number <= last else None
            elif isinstance(x, str):
                try:
                    parsed = datetime.strptime(x, "%d/%m/%Y %H:%M:%S" if name == "at" else "%d.%m.%Y")
                except ValueError:
                    parsed = None
                if parsed is not None and name == "at":
                    value = int((parsed.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()
                                * 1_000_000)
                elif parsed is not None:
                    value = parsed.date()
            if value is None:
                problems.append(f"value field '{name}' is not {described[name]}")
        columns[name] = value
    return columns, "; ".join(problems) or None


def test_timestamps_from_epoch_numbers_and_patterns_in_every_decode(spark):
    """`{type: timestamp, unit: s|ms|us}` reads a JSON integer or a string of its digits, up to year 9999;
    `{type: timestamp|date, format: pattern}` reads a string in Spark's pattern: the same columns and reasons by
    the fast path, the strict path (a wrong `zz` beside them) and the JVM decode, equal to an oracle."""
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.session.timeZone", "UTC")  # as the stage's session; a pattern without a zone is UTC
    values = [*EPOCH_GOOD, *({"b": 9, name: x} for name, xs in EPOCH_WRONG.items() for x in xs)]
    data = [json.dumps(v).encode() for v in values]
    forced = [b'{"zz": "x", ' + d[1:] for d in data]
    spec = {"format": "json", "fields": EPOCH_FIELDS, "required": ["b"]}
    records = spark.createDataFrame([(i, d) for i, d in enumerate([*data, *forced])], "n int, value binary")
    decoded_by = {}
    for on_jvm, fields in ((False, EPOCH_FIELDS), (True, EPOCH_FIELDS), (False, {**EPOCH_FIELDS, "zz": "int"})):
        fmt = formats("raw", {**spec, "fields": fields})[1]
        fmt = fmt.on_jvm() if on_jvm else fmt
        assert fmt.jvm == on_jvm
        decoded = decode_record(formats("raw", "raw")[0], fmt, F.col("key"), F.col("value"))
        columns = [F.unix_micros(F.col(n).cast("timestamp")).alias(n) if n in ("ms", "sec", "us", "at") else n
                   for n in ("b", "ms", "sec", "us", "at", "day")]
        rows = select_decoded(records.withColumn("key", F.lit(None).cast("binary")), decoded, decoded.reason,
                              "reason").select("n", *columns, "reason").orderBy("n").collect()
        decoded_by[(on_jvm, len(fields))] = rows
    plain, jvm_rows, strict = (decoded_by[(False, 6)], decoded_by[(True, 6)], decoded_by[(False, 7)])
    for i, v in enumerate(values):
        columns, reason = epoch_expected(v)
        got = plain[i].asDict()
        assert ({k: got[k] for k in columns}, got["reason"]) == (columns, reason), v
        assert jvm_rows[i].asDict() == got, v
        forced_row = strict[len(values) + i].asDict()
        assert {k: forced_row[k] for k in columns} == columns, v
        assert forced_row["reason"] == "; ".join(r for r in (reason, "value field 'zz' is not an int") if r), v
    assert sum(r["reason"] is None for r in plain[:len(values)]) == len(EPOCH_GOOD)
