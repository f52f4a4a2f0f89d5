"""`debezium`: a Debezium change event in Kafka Connect's JSON, with or without its `schema` part.

A value is the envelope `{"before": {...}, "after": {...}, "op": "c", "source": {"lsn": ..., "ts_ms": ...}}` (inside
`{"schema": ..., "payload": ...}` when the converter's `schemas.enable` is true, its default). The declared fields
are read from the row image, `after` for a create (`c`), an update (`u`) and a snapshot read (`r`), `before` for a
delete (`d`), and four columns say what the change is (`CHANGE_COLUMNS`): `__op`, `__deleted` (true for a delete),
`__lsn` (the change's position in the source's log, `source.lsn`, which orders the changes of a key) and
`__source_ts` (`source.ts_ms`, when the source committed it: an event time). A key is the primary key's struct: its
declared fields, read from the key object (or its `payload`).

Debezium's encodings of a column, by the declared type: `decimal(p,s)` by `decimal_handling` (Debezium's
`decimal.handling.mode`): `precise`, the default, is base64 of the unscaled value's two's-complement bytes (up to 16
bytes); `string` its text; `double` a JSON number. A `date` is `io.debezium.time.Date`, days since 1970-01-01 (an ISO
string reads too); a `timestamp` is `io.debezium.time.ZonedTimestamp`'s ISO text (a `timestamptz` column), or an
epoch number with `unit` (`ms` for `io.debezium.time.Timestamp`, `us` for `MicroTimestamp`: a `timestamp` column).
Every other type reads as the json format reads it (`formats/json.py`).

A record the format cannot read is bad, with the reason: not JSON, no `op`, an `op` other than c, r, u, d, no row
image, no `source.lsn`, a field of another type, and a key whose fields differ from the row's (`key_problem`). A
tombstone (a null value) decodes to nulls and is never bad: the tombstone rule (docs/formats.md#tombstones) applies
to it. A truncate (`t`) stops its batch instead (`stopping_reasons`): past it, the target would keep rows the source
no longer has (docs/cdc.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from microbatch.formats.avro import AvroField
from microbatch.formats.base import Decoded, Format
from microbatch.formats.fields import DeclaringSpec, converted
from microbatch.formats.json import JsonField, _not_a, _path, fits

if TYPE_CHECKING:
    from pyspark.sql import Column

    from microbatch.formats.inference import Sample, SampledSide

CHANGE_COLUMNS = {"__op": "string", "__deleted": "boolean", "__lsn": "bigint", "__source_ts": "timestamp"}
"""The columns a value gets beside its declared fields: what the change is, and its position in the source's log."""
OPS = ("c", "r", "u", "d")
"""The operations applied: create, snapshot read, update (each an upsert of `after`), delete (of `before`'s key)."""
UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""Debezium's default `unavailable.value.placeholder`: an unchanged TOASTed column of an update."""


class DebeziumField(JsonField):
    """A declared field of a change event: a JSON field's, and (converter avro) a `binary` one, which JSON lacks;
    `DebeziumSpec` refuses what its converter cannot hold."""

    refused = None


class DebeziumSpec(DeclaringSpec):
    """`{format: debezium, fields: {name: spark_sql_type, ...}, decimal_handling: precise}`."""

    format: Literal["debezium"] = "debezium"
    payload = "Debezium"
    fields: dict[str, DebeziumField] = Field(default_factory=dict, validate_default=True)
    """The table's columns the job gets, each a field of the row image (`after`, or `before` for a delete), in
    column order; on the key side, the primary key's columns."""
    decimal_handling: Literal["precise", "string", "double"] = "precise"
    """The connector's `decimal.handling.mode`, which says how a `decimal` field is written (converter json; with
    avro the schema says)."""
    converter: Literal["json", "avro"] = "json"
    """The connector's converter: `json`, Kafka Connect's JsonConverter, with or without its `schema` part; `avro`,
    Confluent's or Apicurio's AvroConverter: the Confluent wire format, its schemas in the schema registry, read as
    the `avro` format reads them (`subject`, `version`; formats/debezium_avro.py)."""
    subject: str | None = None
    """converter avro: the registry subject, by default `<topic>-value` (or `-key`)."""
    version: int | Literal["latest"] = "latest"
    """converter avro: the reader schema, the subject's `latest` version when a batch is planned, or a fixed one."""

    @model_validator(mode="after")
    def _converter_settings(self) -> DebeziumSpec:
        if self.converter == "json" and (self.subject is not None or self.version != "latest"):
            raise ValueError("subject and version name the registry schemas of `converter: avro`; drop them, or "
                             "read the topic with `converter: avro`")
        if self.converter == "avro" and self.decimal_handling != "precise":
            raise ValueError("decimal_handling says how Debezium's JSON writes a decimal; with `converter: avro` the "
                             "schema says it (a decimal, a string or a double field): drop decimal_handling")
        refused = JsonField.refused if self.converter == "json" else AvroField.refused
        if refused is not None and any(refused[0] in field.type for field in self.fields.values()):
            raise ValueError(f"fields: {refused[1]} (converter {self.converter})")
        if isinstance(self.version, int) and self.version < 1:
            raise ValueError(f"{self.version} is not a schema version; versions count from 1, or write `latest`")
        return self


def decimal_from_base64(text: Column, precision: int, scale: int) -> Column:
    """The decimal(precision, scale) whose unscaled value is the big-endian two's-complement integer of the base64
    `text` (Debezium's precise decimal, Kafka Connect's `Decimal`): null when it is not base64, is empty or does not
    fit. One fold over the bytes, with `text` read a few times only: the optimizer may copy a column's expression into
    a filter pushed below it (the stage's dead letters), once per reference."""
    from pyspark.sql import functions as F

    digits = F.hex(F.try_to_binary(text, F.lit("base64")))
    count = F.length(digits) / 2
    negative = F.substring(digits, 1, 1) >= F.lit("8")

    def add_byte(total: Column, index: Column) -> Column:
        byte = F.conv(F.substring(digits, index * 2 - 1, 2), 16, 10).cast("int")
        return F.try_add(F.try_multiply(total, F.lit(256).cast("decimal(38,0)")),
                         F.when(negative, 255 - byte).otherwise(byte).cast("decimal(38,0)")).cast("decimal(38,0)")

    magnitude = F.aggregate(F.sequence(F.lit(1), count.cast("int")), F.lit(0).cast("decimal(38,0)"), add_byte)
    sign = F.when(negative, F.lit(-1)).otherwise(F.lit(1)).cast("decimal(38,0)")
    unscaled = F.try_multiply(sign, F.try_add(magnitude, F.when(negative, 1).otherwise(0).cast("decimal(38,0)")))
    unit = F.lit(f"1e-{scale}").cast(f"decimal({scale + 1},{scale})")  # 10^-scale, exact
    scaled = unscaled if scale == 0 else F.try_multiply(unscaled, unit)
    return F.when(count > 0, scaled.try_cast(f"decimal({precision},{scale})"))


def change_reason(reason: Column, op: Column, row: Column, lsn: Column) -> Column:
    """`reason` (a CASE) gone on with the reasons of a change event the format does not apply: no `op`, a truncate,
    an `op` other than c, r, u, d, no row image (`row`: `before` for a delete, else `after`), no `source.lsn`."""
    from pyspark.sql import functions as F

    return (reason.when(op.isNull(), "value is not a Debezium change event: it has no op")
            .when(op == "t", "value is a truncate (op t) of the source table, which microbatch does not apply")
            .when(~op.isin(*OPS), F.concat(F.lit("value op '"), op, F.lit("' is not one of c, r, u, d")))
            .when(row.isNull(), F.concat(F.lit("value has no "), F.when(op == "d", "before").otherwise("after"),
                                         F.lit(" image for op '"), op, F.lit("'")))
            .when(lsn.isNull(), "value has no source.lsn, which orders a key's changes"))


def change_columns(read: Column, op: Column, lsn: Column, ts_ms: Column) -> dict[str, Column]:
    """`CHANGE_COLUMNS` of a change event, null where it is not `read` (a tombstone, a bad record)."""
    from pyspark.sql import functions as F

    change = {"__op": op, "__deleted": op == "d", "__lsn": lsn, "__source_ts": F.timestamp_millis(ts_ms)}
    return {name: F.when(read, column).cast(CHANGE_COLUMNS[name]) for name, column in change.items()}


class DebeziumFormat(Format[DebeziumSpec]):
    name = "debezium"
    spec_model = DebeziumSpec
    declares_names = True
    change_stream = True
    guess_rank = 0
    stopping_reasons = ("value is a truncate",)

    @classmethod
    def looks_like(cls, sample: Sample) -> bool:
        """Every non-null value a change event; a key, every one an object (`formats/debezium_inference.py`)."""
        from microbatch.formats import debezium_inference

        return debezium_inference.looks_like(sample)

    @classmethod
    def infer(cls, sample: Sample) -> SampledSide:
        """The row's fields, typed by the converter's schema part where there is one; a value wants an upsert."""
        from microbatch.formats import debezium_inference

        return debezium_inference.infer(sample)

    def columns(self) -> dict[str, str]:
        return {**{name: field.type for name, field in self.spec.fields.items()}, **CHANGE_COLUMNS}

    def side_columns(self, side: str) -> dict[str, str]:
        """A key is the primary key's columns alone."""
        return self.columns() if side == "value" else {name: f.type for name, f in self.spec.fields.items()}

    def _field_value(self, element: Column, field: JsonField) -> tuple[Column, Column, bool]:
        """(whether the JSON kind of the row's `element`, neither SQL nor JSON null, fits the declared field; its
        column; whether it fits only where that column is not null)."""
        from pyspark.sql import functions as F

        kind = field.sql_type
        json_kind = F.schema_of_variant(element)
        as_text = F.try_variant_get(element, "$", "string")
        if kind.name == "decimal" and self.spec.decimal_handling != "double":
            precision, scale = (int(n) for n in field.type[len("decimal("):-1].split(","))
            value = decimal_from_base64(as_text, precision, scale) if self.spec.decimal_handling == "precise" \
                else as_text.try_cast(field.type)
            return json_kind == "STRING", value, True
        if kind.name == "date":
            days = F.try_variant_get(element, "$", "int")
            value = F.when(json_kind == "BIGINT", F.date_from_unix_date(days)).otherwise(as_text.try_cast("date"))
            return json_kind.isin("BIGINT", "STRING"), value, True
        if field.converts:
            value = converted(field, as_text)
            kinds = ("STRING", "BIGINT") if field.unit is not None else ("STRING",)
            return json_kind.isin(*kinds), value, True
        value = element if kind.name == "variant" else F.try_variant_get(element, "$", field.type)
        return fits(element, kind), value, False

    def decode(self, data: Column, subject: str) -> Decoded:
        """In layers (`Decoded.helpers`): the document; its envelope (the `payload` when it has a schema part); the
        operation, the row image and the source position; each field's element; its check and value."""
        from pyspark.sql import functions as F

        def helper(what: str) -> str:
            return f"__mb_{subject}_dbz_{what}"

        value_side = subject == "value"
        document = F.try_parse_json(F.when(F.is_valid_utf8(data), data.cast("string")))
        doc = F.col(helper("document"))
        payload = F.try_variant_get(doc, "$.payload", "variant")
        wrapped = F.try_variant_get(doc, "$.schema", "variant").isNotNull() & payload.isNotNull() \
            & ~F.is_variant_null(payload)
        envelope = {helper("envelope"): F.when(wrapped, payload).otherwise(doc),
                    helper("object"): F.try_variant_get(doc, "$", "struct<>").isNotNull()}
        env = F.col(helper("envelope"))
        op = F.col(helper("op"))
        if value_side:
            head = {helper("op"): F.try_variant_get(env, "$.op", "string"),
                    helper("lsn"): F.try_variant_get(env, "$.source.lsn", "bigint"),
                    helper("ts_ms"): F.try_variant_get(env, "$.source.ts_ms", "bigint")}
            image = F.when(op == "d", F.try_variant_get(env, "$.before", "variant")) \
                .otherwise(F.try_variant_get(env, "$.after", "variant"))
            row_layer = {helper("row"): F.when(~F.is_variant_null(image), image)}
        else:
            head, row_layer = {}, {helper("row"): F.when(F.col(helper("object")), env)}
        row = F.col(helper("row"))
        fields = list(self.spec.fields.items())
        elements = {helper(f"element{i}"): F.try_variant_get(row, _path(field.read_from(name)), "variant")
                    for i, (name, field) in enumerate(fields)}
        values, checks, columns, problems = {}, {}, {}, []
        for i, (name, field) in enumerate(fields):
            element = F.col(helper(f"element{i}"))
            kind_fits, value, must_read = self._field_value(element, field)
            values[helper(f"fits{i}")], values[helper(f"raw{i}")] = kind_fits, value
            present = element.isNotNull() & ~F.is_variant_null(element)
            fitting = F.col(helper(f"fits{i}")) & (F.col(helper(f"raw{i}")).isNotNull() if must_read else F.lit(True))
            checks[helper(f"value{i}")] = F.when(present & fitting, F.col(helper(f"raw{i}"))).cast(field.type)
            checks[helper(f"problem{i}")] = F.when(present & ~fitting, _not_a(subject, name, field))
            columns[name] = F.col(helper(f"value{i}"))
            problems.append(F.col(helper(f"problem{i}")))
        reason = (F.when(data.isNull(), F.lit(None))
                  .when(~F.is_valid_utf8(data), f"{subject} is not valid UTF-8")
                  .when(doc.isNull(), f"{subject} is not JSON")
                  .when(~F.col(helper("object")), f"{subject} is not a JSON object"))
        if value_side:
            reason = change_reason(reason, op, row, F.col(helper("lsn")))
        reason = reason.otherwise(F.when(F.coalesce(*problems).isNotNull(), F.concat_ws("; ", *problems)))
        judged = {helper("reason"): reason.cast("string")}
        if value_side:
            read = F.col(helper("reason")).isNull() & data.isNotNull()
            columns.update(change_columns(read, op, F.col(helper("lsn")), F.col(helper("ts_ms"))))
        layers = ({helper("document"): document}, envelope, head, row_layer, elements, values, checks, judged)
        return Decoded(columns=columns, reason=F.col(helper("reason")), helpers=tuple(lay for lay in layers if lay),
                       sql_conf={"spark.sql.variant.allowDuplicateKeys": "true"})

    def key_problem(self, key: Format[Any], key_columns: Mapping[str, Column], columns: Mapping[str, Column],
                    value_data: Column) -> Column | None:
        """A change event whose record key differs from its row's primary key columns (each key field the row
        declares too): the reason, else null."""
        from pyspark.sql import functions as F

        if not isinstance(key, DebeziumFormat):
            return None
        shared = [name for name in key.spec.fields if name in self.spec.fields]
        if not shared:
            return None
        differs = [F.when(key_columns[name].eqNullSafe(columns[name]), F.lit(None)).otherwise(F.lit(name))
                   for name in shared]
        names = F.concat_ws(", ", *differs)
        return F.when(value_data.isNotNull() & (names != ""), F.concat(
            F.lit("key field(s) "), names, F.lit(" differ from the change's row: the record key is not the table's "
                                                 "primary key")))

    def pins(self, metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        declared = {"fields": [[name, field.type, field.read_from(name), *([field.unit or field.format]
                                                                            if field.converts else [])]
                               for name, field in self.spec.fields.items()],
                    "decimal_handling": self.spec.decimal_handling}
        digest = hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()
        return {"format": self.name, "fields_sha256": digest}
