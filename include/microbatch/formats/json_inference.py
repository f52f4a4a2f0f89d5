"""The json format's reading of a sample (`microbatch new --from-topic`): whether every value is a JSON object as
Spark reads one, and the fields, their types merged across the sample (`formats.json_types`), the `required` ones
(non-null in every object), and the columns a sink stores. A nested object is declared a struct and flattened into
one column per leaf (`customer['address']['city']` into `customer_address_city`); an array, a map and a variant
are stored as their JSON text. A top-level field whose values are all epoch times near now is declared a timestamp
read in its unit."""

from __future__ import annotations

import json
from typing import Any

from microbatch.formats.inference import (
    INFER_RESERVED,
    Sample,
    SampledColumn,
    SampledSide,
    quote_sql,
    snake_case,
)
from microbatch.formats.json_types import NULL, JsonType, epoch_unit, merge, observe


def parse_object(data: bytes) -> dict[str, Any] | None:
    """A JSON object as Spark's parser reads it (UTF-8, no repeated name, no NaN or Infinity), else None."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({name for name, _ in items}) != len(items):
            raise ValueError("a repeated name")
        return dict(items)

    def constant(name: str) -> float:
        raise ValueError(name)

    try:
        parsed = json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except (UnicodeDecodeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def all_objects(sample: Sample) -> bool:
    """Whether the sample has a non-null value and every non-null one is a JSON object."""
    return bool(sample.present) and all(parse_object(d) is not None for d in sample.present)


def flatten(column: str, expression: str, kind: JsonType, origin: str) -> list[SampledColumn]:
    """The columns of one decoded value: an atomic one is one column, a struct one column per field (nested
    structs flattened too, `customer_address_city` from `customer['address']['city']`), and an array, a map or a
    variant one column of its JSON text (`to_json`)."""
    if kind.kind == "struct":
        out: list[SampledColumn] = []
        for name, field in kind.fields:
            out += flatten(f"{column}_{snake_case(name)}", f"{expression}['{name}']", field, f"{origin}.{name}")
        return out
    if kind.kind in ("array", "map", "variant"):
        return [SampledColumn(column, "string", f"to_json({expression})", f"{origin} ({kind.spark}, as JSON text)")]
    spark = "string" if kind.kind == "null" else kind.kind
    return [SampledColumn(column, spark, expression, f"{origin} ({spark})")]


def infer(sample: Sample, fmt: str) -> SampledSide:
    """The format `fmt` (json) of a sample whose every non-null value is a JSON object (`all_objects`)."""
    side = sample.side
    objects = [o for o in (parse_object(d) for d in sample.present) if o is not None]
    kinds: dict[str, JsonType] = {}
    filled: dict[str, list[object]] = {}
    for obj in objects:
        for name, value in obj.items():
            kinds[name] = merge(kinds.get(name, NULL), observe(value))
            filled.setdefault(name, [])
            if value is not None:
                filled[name].append(value)
    fields: dict[str, Any] = {}
    required: list[str] = []
    columns: list[SampledColumn] = []
    notes: list[str] = []
    for json_name, kind in kinds.items():
        field = snake_case(json_name)
        if field in INFER_RESERVED:
            field = f"payload_{field}"
        prefix = "" if side == "value" else "key_"
        suffix, n = "", 2
        while f"{prefix}{field}{suffix}" in sample.records or f"{field}{suffix}" in fields:
            suffix, n = f"_{n}", n + 1
        field += suffix
        column = f"{prefix}{field}"
        sample.records.add(column)
        if len(filled[json_name]) == len(objects):
            required.append(field)
        epoch = epoch_unit(filled[json_name], sample.now)
        if epoch is None:
            fields[field] = kind.spark if field == json_name else {"type": kind.spark, "from": json_name}
            columns += flatten(column, quote_sql(column), kind, f"{side}.{json_name}")
            continue
        declared = {"type": "timestamp", "unit": epoch.unit, **({} if field == json_name else {"from": json_name})}
        fields[field] = declared
        columns.append(SampledColumn(column, "timestamp", quote_sql(column),
                                     f"{side}.{json_name} (epoch {epoch.unit})"))
        flow = ", ".join(f"{k}: {v}" for k, v in declared.items())
        notes.append(f"{side}.{json_name}: {epoch.described}, declared {{{flow}}}")
    spec: dict[str, Any] = {"format": fmt, "fields": fields}
    if required:
        spec["required"] = required
    sampled = len(sample.datas)
    nulls = f" ({sampled - len(objects)} null)" if sampled > len(objects) else ""
    summary = (f"{fmt}: {len(objects)} object(s){nulls}, {len(fields)} field(s), required: "
               f"{', '.join(required) or 'none'}")
    return SampledSide(fmt, spec, tuple(columns), summary, tuple(notes))
