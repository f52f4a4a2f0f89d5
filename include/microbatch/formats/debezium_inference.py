"""The debezium format's reading of a sample (`microbatch new --from-topic`): whether every value is a Debezium
change event, and the row's fields, typed exactly from the converter's `schema` part when the sample has one, else
from the values (`formats.json_types`); a key is the primary key's fields, read from the key object (or its
`payload`). The side it gives a value says the sink it wants (`Upsert`): one row a primary key, ordered by `__lsn`,
deleted on `__deleted`, an unchanged TOASTed text kept.

Kafka Connect's schema types map to Spark SQL types (`CONNECT_TYPES`), Debezium's logical types by their names
(`LOGICAL_TYPES`; a `Decimal` to `decimal(p,s)`, its precision `connect.decimal.precision`, 38 when absent). Without
a schema part, a `numeric` column's precise bytes are a base64 string that no value tells from a text: it is declared
a string, with a note.
"""

from __future__ import annotations

import re
from typing import Any

from microbatch.formats.inference import (
    INFER_RESERVED,
    Sample,
    SampledColumn,
    SampledSide,
    Upsert,
    quote_sql,
    snake_case,
)
from microbatch.formats.json_inference import flatten, parse_object
from microbatch.formats.json_types import NULL, JsonType, epoch_unit, merge, observe

CONNECT_TYPES = {"int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint", "float32": "float",
                 "float64": "double", "boolean": "boolean", "string": "string"}
"""Kafka Connect's schema types as Spark SQL types (bytes, arrays, maps and structs are read from the values)."""
LOGICAL_TYPES: dict[str, str | dict[str, str]] = {
    "io.debezium.time.ZonedTimestamp": "timestamp",
    "io.debezium.time.MicroTimestamp": {"type": "timestamp_ntz", "unit": "us"},
    "io.debezium.time.Timestamp": {"type": "timestamp_ntz", "unit": "ms"},
    "org.apache.kafka.connect.data.Timestamp": {"type": "timestamp_ntz", "unit": "ms"},
    "io.debezium.time.Date": "date",
    "org.apache.kafka.connect.data.Date": "date",
}
"""Debezium's (and Kafka Connect's) logical types by their schema names: the declared field."""
DECIMAL = "org.apache.kafka.connect.data.Decimal"
CHANGE_SINK_COLUMNS = (("__op", "string"), ("__lsn", "bigint"))
"""The change columns an upsert sink stores beside the row's (`__deleted` is selected, never stored)."""
UPSERT = Upsert(order_by="__lsn", delete_column="__deleted", unavailable_value="__debezium_unavailable_value")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _parsed(data: bytes) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """A JSON object and its converter schema: (the payload, the schema) when it is `{"schema": ..., "payload":
    {...}}`, else (the object, None); None when it is no JSON object."""
    obj = parse_object(data)
    if obj is None:
        return None
    payload, schema = obj.get("payload"), obj.get("schema")
    if set(obj) == {"schema", "payload"} and isinstance(payload, dict):
        return payload, schema if isinstance(schema, dict) else None
    return obj, None


def _is_change(envelope: dict[str, Any]) -> bool:
    return "op" in envelope and "source" in envelope and ("before" in envelope or "after" in envelope)


def looks_like(sample: Sample) -> bool:
    """A value: every non-null one a Debezium change event (an object with `op`, `source` and `before` or `after`,
    directly or as the `payload` beside a `schema`). A key: every non-null one a JSON object, when the value side
    is a change stream (`Sample.change_stream`): the primary key's struct."""
    if not sample.present:
        return False
    parsed = [_parsed(d) for d in sample.present]
    if sample.side == "key":
        return sample.change_stream and all(p is not None for p in parsed)
    return all(p is not None and _is_change(p[0]) for p in parsed)


def _row_schema(schema: dict[str, Any] | None, side: str) -> dict[str, dict[str, Any]]:
    """The row's field schemas by name: the key schema's fields, or those of the envelope's `after` (`before`)."""
    if schema is None:
        return {}
    fields = schema.get("fields") or []
    if side == "value":
        image = next((f for f in fields if isinstance(f, dict) and f.get("field") in ("after", "before")), {})
        fields = image.get("fields") or []
    return {f["field"]: f for f in fields if isinstance(f, dict) and isinstance(f.get("field"), str)}


def declared(field_schema: dict[str, Any]) -> str | dict[str, str] | None:
    """The declared field of one Kafka Connect field schema: by its logical name, else its type; None for a type
    the values say better (bytes, arrays, maps, structs)."""
    name = field_schema.get("name")
    if name == DECIMAL:
        parameters = field_schema.get("parameters") or {}
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", 38))
        return f"decimal({max(precision, scale, 1)},{scale})"
    if name in LOGICAL_TYPES:
        return LOGICAL_TYPES[name]
    return CONNECT_TYPES.get(field_schema.get("type", ""))


def _images(envelope: dict[str, Any], side: str) -> list[dict[str, Any]]:
    if side == "key":
        return [envelope]
    image = envelope.get("before") if envelope.get("op") == "d" else envelope.get("after")
    return [image] if isinstance(image, dict) else []


def _looks_base64(values: list[object]) -> bool:
    """Every value a base64 text, one with a character a word rarely has (a digit, +, / or =)."""
    texts = [v for v in values if isinstance(v, str)]
    return bool(texts) and len(texts) == len(values) and all(_BASE64.fullmatch(t) for t in texts) \
        and any(re.search(r"[0-9+/=]", t) for t in texts)


def _observed(parsed: list[tuple[dict[str, Any], dict[str, Any] | None]], side: str,
              ) -> tuple[dict[str, JsonType], dict[str, list[object]], dict[str, dict[str, Any]]]:
    """The row's fields in order of first sight: the type of their values (a placeholder of a value the change left
    out aside), their non-null values, and their schemas (where a record has a schema part)."""
    kinds: dict[str, JsonType] = {}
    seen: dict[str, list[object]] = {}
    schemas: dict[str, dict[str, Any]] = {}
    for envelope, schema in parsed:
        for name, field_schema in _row_schema(schema, side).items():
            schemas.setdefault(name, field_schema)
        for image in _images(envelope, side):
            for name, value in image.items():
                kinds.setdefault(name, NULL)
                seen.setdefault(name, [])
                if value is not None and value != UPSERT.unavailable_value:
                    kinds[name] = merge(kinds[name], observe(value))
                    seen[name].append(value)
    for name in schemas:
        kinds.setdefault(name, NULL)
        seen.setdefault(name, [])
    return kinds, seen, schemas


def _field_name(source_name: str, prefix: str, sample: Sample, fields: dict[str, Any]) -> str:
    """The declared name of a row's field, as the json format names it: snake_case, not a reserved name, not a
    decoded column already named (`sample.records`, to which its column is added)."""
    field = snake_case(source_name)
    if field in INFER_RESERVED:
        field = f"payload_{field}"
    suffix, n = "", 2
    while f"{prefix}{field}{suffix}" in sample.records or f"{field}{suffix}" in fields:
        suffix, n = f"_{n}", n + 1
    sample.records.add(f"{prefix}{field}{suffix}")
    return field + suffix


def infer(sample: Sample) -> SampledSide:
    """The debezium side of a sample that `looks_like` it: the row's (or key's) fields in order of first sight,
    typed from the schema part where a record has one, else from the values."""
    side = sample.side
    parsed = [p for p in (_parsed(d) for d in sample.present) if p is not None]
    kinds, seen, schemas = _observed(parsed, side)
    fields: dict[str, Any] = {}
    columns: list[SampledColumn] = []
    notes: list[str] = []
    prefix = "" if side == "value" else "key_"
    for source_name, kind in kinds.items():
        field = _field_name(source_name, prefix, sample, fields)
        column = f"{prefix}{field}"
        origin = f"{side}.{source_name}"
        typed = declared(schemas[source_name]) if source_name in schemas else None
        epoch = epoch_unit(seen[source_name], sample.now) if typed is None and kind.kind == "bigint" else None
        if typed is None and epoch is not None:
            typed = {"type": "timestamp_ntz", "unit": epoch.unit}
            notes.append(f"{origin}: {epoch.described}, declared {{type: timestamp_ntz, unit: {epoch.unit}}} "
                         "(io.debezium.time.Timestamp or MicroTimestamp: a timestamp without time zone)")
        elif typed is None and not schemas and _looks_base64(seen[source_name]):
            notes.append(f"{origin}: base64 text, declared a string; if it is a numeric column's bytes "
                         "(decimal.handling.mode=precise), declare it decimal(p,s): only the converter's schema "
                         "part (schemas.enable) tells its scale")
        if typed is None:
            fields[field] = kind.spark if field == source_name else {"type": kind.spark, "from": source_name}
            columns += flatten(column, quote_sql(column), kind, origin)
            continue
        spec = typed if isinstance(typed, dict) else {"type": typed}
        spark = spec["type"]
        fields[field] = typed if field == source_name else {**spec, "from": source_name}
        columns.append(SampledColumn(column, spark, quote_sql(column), f"{origin} ({spark})"))
    if side == "value":
        for name, spark in CHANGE_SINK_COLUMNS:
            columns.append(SampledColumn(name, spark, name, f"{name} ({spark}, the change)"))
    spec_out: dict[str, Any] = {"format": "debezium", "fields": fields}
    with_schema = sum(1 for _, schema in parsed if schema is not None)
    typed_by = f", typed by the schema part of {with_schema}" if with_schema else ", typed by their values"
    what = "change event(s)" if side == "value" else "key(s)"
    summary = f"debezium: {len(parsed)} {what}{typed_by}, {len(fields)} field(s)"
    if side == "key":
        summary += f", the primary key: {', '.join(fields) or 'none'}"
        return SampledSide("debezium", spec_out, tuple(columns), summary, tuple(notes), keys=tuple(fields))
    ops = sorted({str(p[0].get("op")) for p in parsed})
    summary += f", op(s) {', '.join(ops)}"
    return SampledSide("debezium", spec_out, tuple(columns), summary, tuple(notes), upsert=UPSERT)

