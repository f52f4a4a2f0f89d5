"""The `debezium` format decodes Kafka Connect's JSON change events on real Spark (issue 65, item 1).

The events are written here as Debezium writes them (with and without the converter's `schema` part), and each
expected column is computed with Python alone (`int.from_bytes` for a precise decimal, `datetime` for the time
types), not by the code under test."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal
from typing import Any

import pytest
from pydantic import TypeAdapter

from microbatch.formats.record import decode_record, select_decoded
from microbatch.formats.registry import FormatSpecs, format_for

pytestmark = pytest.mark.integration

FIELDS = {"region": "string", "order_id": "bigint", "amount": "decimal(12,2)", "big": "decimal(38,4)",
          "placed_at": "timestamp", "local_at": {"type": "timestamp_ntz", "unit": "us"}, "day": "date",
          "note": "string"}
KEY_FIELDS = {"region": "string", "order_id": "bigint"}


def precise(value: Decimal, scale: int) -> str:
    """Debezium's precise decimal: base64 of the unscaled value's big-endian two's-complement bytes."""
    unscaled = int(value.scaleb(scale, Context(prec=80)))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def event(op: str, row: dict[str, Any] | None, lsn: int | None = 100, *, schema: bool = True,
          before: dict[str, Any] | None = None) -> bytes:
    payload = {"before": before if op != "d" else row, "after": None if op == "d" else row, "op": op,
               "ts_ms": 1_764_410_000_123, "source": {"connector": "postgresql", "ts_ms": 1_764_410_000_000,
                                                      **({"lsn": lsn} if lsn is not None else {}), "txId": 7}}
    document = {"schema": {"type": "struct", "name": "cdc.public.orders.Envelope"}, "payload": payload} \
        if schema else payload
    return json.dumps(document).encode()


def key(region: str, order_id: int, *, schema: bool = True) -> bytes:
    payload = {"region": region, "order_id": order_id}
    return json.dumps({"schema": {"type": "struct"}, "payload": payload} if schema else payload).encode()


ROWS = [
    {"region": "eu", "order_id": 1, "amount": Decimal("1234567890.12"), "big": Decimal("-12345678901234567890.1234"),
     "placed_at": "2026-11-29T10:15:30.123456Z", "local_at": 1_764_411_330_123_456, "day": 20_421, "note": None},
    {"region": "us", "order_id": 2, "amount": Decimal("-0.01"), "big": Decimal("0"),
     "placed_at": "2026-01-01T00:00:00Z", "local_at": 0, "day": "2026-02-28", "note": "x"},
    {"region": "ap", "order_id": 3, "amount": Decimal("-128.00"), "big": Decimal("99999999999999999999999999.9999"),
     "placed_at": None, "local_at": None, "day": None, "note": "__debezium_unavailable_value"},
]


def encoded(row: dict[str, Any]) -> dict[str, Any]:
    scales = {"amount": 2, "big": 4}
    return {name: precise(value, scales[name]) if name in scales else value for name, value in row.items()}


def expected_row(row: dict[str, Any]) -> dict[str, Any]:
    day = row["day"]
    return {
        "region": row["region"], "order_id": row["order_id"], "amount": row["amount"], "big": row["big"],
        "placed_at": None if row["placed_at"] is None
        else datetime.fromisoformat(row["placed_at"]).astimezone(UTC).replace(tzinfo=None),
        "local_at": None if row["local_at"] is None else datetime(1970, 1, 1) + timedelta(microseconds=row["local_at"]),
        "day": None if day is None else date(1970, 1, 1) + timedelta(days=day) if isinstance(day, int)
        else date.fromisoformat(day), "note": row["note"]}


def decode(spark: Any, records: list[tuple[bytes | None, bytes | None]], *, decimal_handling: str = "precise",
           fields: dict[str, Any] = FIELDS) -> list[dict[str, Any]]:
    adapter = TypeAdapter(FormatSpecs)
    key_format = format_for(adapter.validate_python({"format": "debezium", "fields": KEY_FIELDS}))
    value_format = format_for(adapter.validate_python({"format": "debezium", "fields": fields,
                                                       "decimal_handling": decimal_handling}))
    frame = spark.createDataFrame([(i, k, v) for i, (k, v) in enumerate(records)], "i int, key binary, value binary")
    decoded = decode_record(key_format, value_format, frame["key"], frame["value"])
    rows = select_decoded(frame, decoded, decoded.reason, "reason").orderBy("i").collect()
    return [row.asDict() for row in rows]


def test_change_events_decode_to_the_row_the_change_and_its_position(spark: Any) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    records = []
    for i, row in enumerate(ROWS):
        records.append((key(row["region"], row["order_id"], schema=i != 1),
                        event("cdc"[i % 3] if i != 1 else "r", encoded(row), lsn=1000 + i, schema=i != 1)))
    records.append((key("eu", 1), event("u", encoded(ROWS[0]), lsn=2000)))
    records.append((key("eu", 1), event("d", {"region": "eu", "order_id": 1}, lsn=3000, schema=False)))
    records.append((key("eu", 1), None))  # the tombstone after the delete
    out = decode(spark, records)
    ops = ["c", "r", "c", "u", "d"]
    for i, row in enumerate([*ROWS, ROWS[0]]):
        got = out[i]
        assert got["reason"] is None, got
        assert {name: got[name] for name in FIELDS} == expected_row(row)
        assert (got["__op"], got["__deleted"], got["__lsn"]) == (ops[i], False, [1000, 1001, 1002, 2000][i])
        assert got["__source_ts"] == datetime.fromtimestamp(1_764_410_000, UTC).replace(tzinfo=None)
        assert (got["key_region"], got["key_order_id"]) == (row["region"], row["order_id"])
    deleted = out[4]
    assert (deleted["reason"], deleted["__op"], deleted["__deleted"], deleted["__lsn"]) == (None, "d", True, 3000)
    assert (deleted["region"], deleted["order_id"], deleted["amount"]) == ("eu", 1, None)
    tombstone = out[5]
    assert tombstone["reason"] is None and tombstone["key_order_id"] == 1
    assert all(tombstone[name] is None for name in [*FIELDS, "__op", "__deleted", "__lsn"])


def test_decimal_handling_string_and_double(spark: Any) -> None:
    fields = {"order_id": "bigint", "amount": "decimal(12,2)"}
    as_text = [(key("eu", 1), event("c", {"order_id": 1, "amount": "12.30"})),
               (key("eu", 2), event("c", {"order_id": 2, "amount": 12.3}))]
    text_out = decode(spark, as_text, decimal_handling="string", fields=fields)
    assert text_out[0]["amount"] == Decimal("12.30") and text_out[0]["reason"] is None
    assert text_out[1]["reason"] == "value field 'amount' is not a decimal(12,2)"
    double_out = decode(spark, as_text, decimal_handling="double", fields=fields)
    assert double_out[1]["amount"] == Decimal("12.30") and double_out[1]["reason"] is None


def test_what_the_format_cannot_read_is_bad_with_its_reason(spark: Any) -> None:
    good = encoded(ROWS[1])
    records = [
        (key("us", 2), b"not json"),
        (key("us", 2), json.dumps({"schema": {}, "payload": {"after": good}}).encode()),
        (key("us", 2), event("t", None)),
        (key("us", 2), event("x", good)),
        (key("us", 2), event("c", None)),
        (key("us", 2), event("c", good, lsn=None)),
        (key("us", 2), event("c", {**good, "order_id": "two"})),
        (key("us", 3), event("c", good)),
        (key("us", 2), event("c", {**good, "amount": "not base64!"})),
    ]
    reasons = [row["reason"] for row in decode(spark, records)]
    assert reasons == [
        "value is not JSON",
        "value is not a Debezium change event: it has no op",
        "value is a truncate (op t) of the source table, which microbatch does not apply",
        "value op 'x' is not one of c, r, u, d",
        "value has no after image for op 'c'",
        "value has no source.lsn, which orders a key's changes",
        "value field 'order_id' is not a bigint",
        "key field(s) order_id differ from the change's row: the record key is not the table's primary key",
        "value field 'amount' is not a decimal(12,2)",
    ]
