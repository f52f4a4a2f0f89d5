"""`debezium` with `converter: avro`: a Debezium change event as Confluent's (or Apicurio's) AvroConverter writes it.

The bytes are the Confluent wire format, read as the `avro` format reads them (formats/avro.py: the subject
`<topic>-value`, or `-key`, or `subject`; its `latest` version pinned when a batch is planned, or `version`; one
`from_avro` per writer schema, by the id in the header). The value's schema is the envelope, a record
`<prefix>.<schema>.<table>.Envelope` with `before` and `after` (each `["null", Value]`, `Value` the row's record),
`op` (a string), `source` (a record with `lsn`, a nullable long, and `ts_ms`) and `ts_ms`. The declared fields are
read from the row image as the JSON converter's are (formats/debezium.py: `after`, `before` for a delete), with the
same four change columns and the same reasons for a change event microbatch does not apply; a key is the key
record's fields (the primary key).

Each declared field is a field of the row record whose Avro type reads as the declared type (`fits`): the type
`from_avro` gives (docs/formats.md's table), or one of Debezium's encodings of it: a `date` from an `int`
(`io.debezium.time.Date`, days since 1970-01-01) or a string; a `decimal(p,s)` from an Avro `decimal(p,s)`
(`decimal.handling.mode` precise: bytes with the decimal logical type and `connect.decimal.precision`), a string
(mode string) or a double (mode double); a `timestamp` from a string (`io.debezium.time.ZonedTimestamp`, a
`timestamptz` column); an epoch number with `unit` (`{type: timestamp_ntz, unit: us}` for `MicroTimestamp`, a
`timestamp` column; `ms` for `Timestamp`). A value that does not read as its declared type (a string that is no
timestamp, a decimal too large) is a bad record naming the field, as are the wire format's hazards (`avro.wire_reason`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from microbatch.formats.avro import (
    DECODED_MARK,
    reader_fields,
    registry_pins,
    type_changed,
    wire_layers,
    wire_reason,
    writer_counts,
)
from microbatch.formats.base import Decoded, RegistrySchemas
from microbatch.formats.debezium import DebeziumFormat, DebeziumSpec, change_columns, change_reason
from microbatch.formats.fields import DeclaredField, converted
from microbatch.formats.sql_types import parse_type

if TYPE_CHECKING:
    from pyspark.sql import Column


def carriers(field: DeclaredField) -> tuple[str, ...]:
    """The Spark types (as `from_avro` reads the Avro field) that the declared field reads from."""
    if field.converts:
        return ("int", "bigint", "string") if field.unit is not None else ("string",)
    kind = field.sql_type.name
    if kind == "date":
        return ("date", "int", "string")
    if kind == "decimal":
        return (field.type, "string", "double")
    if kind in ("timestamp", "timestamp_ntz"):
        return (field.type, "string")
    return (field.type,)


def row_record(envelope: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row's record schema of an envelope schema (parsed JSON): the record of `before` or `after`, the one that
    defines it (the other names it), with the envelope's namespace when it has none of its own; None when neither
    field is a record or a union of null and a record."""
    fields = {each.get("name"): each.get("type") for each in envelope.get("fields", []) if isinstance(each, dict)}
    for name in ("before", "after"):
        kind = fields.get(name)
        for member in kind if isinstance(kind, list) else [kind]:
            if isinstance(member, dict) and member.get("type") == "record":
                namespace = member.get("namespace", envelope.get("namespace"))
                return {**member, **({"namespace": namespace} if namespace else {})}
    return None


def envelope_problem(reader: str) -> str | None:
    """Why a value's reader schema is not a Debezium envelope the format reads (one clause), or None."""
    schema = json.loads(reader)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return "it is not an Avro record"
    available = reader_fields(reader)
    missing = [name for name in ("before", "after", "op", "source") if name not in available]
    if missing:
        return f"it has no field {', '.join(missing)} (its fields are {', '.join(available)})"
    if available["op"] != "string":
        return f"its op reads as {available['op']}, not string"
    if row_record(schema) is None:
        return "neither before nor after is a record (a union of null and the row's record)"
    try:
        kinds = dict(parse_type(available["source"]).fields)
    except ValueError:  # not a record, or a field Spark cannot read
        kinds = {}
    for name in ("lsn", "ts_ms"):
        if str(kinds.get(name)) not in ("bigint", "int"):
            return f"its source has no long {name} (Debezium's Postgres connector writes source.lsn and source.ts_ms)"
    return None


def row_fields(reader: str, side: str) -> dict[str, str]:
    """The fields of the row a side's reader schema holds, name -> Spark type (`avro.reader_fields`): a value's row
    record, a key's own fields."""
    if side == "key":
        return reader_fields(reader)
    record = row_record(json.loads(reader))
    return {} if record is None else reader_fields(json.dumps(record))


def field_problem(fields: Mapping[str, DeclaredField], available: Mapping[str, str], side: str, where: str,
                  version: int) -> str | None:
    """Why a declared field cannot be read from the row's fields `available` (of `where`), or None."""
    for name, declared in fields.items():
        avro_name = declared.read_from(name)
        if avro_name not in available:
            return (f"{side}.fields.{name}: '{avro_name}' is not a field of the row in {where}; its fields are "
                    f"{', '.join(available)}; declare one of them, or read another name with `from`")
        actual = available[avro_name]
        if actual.startswith("!"):
            return f"{side}.fields.{name}: the field '{avro_name}' of {where} cannot be a column: {actual[1:]}"
        problem = _type_problem(f"{side}.fields.{name}", declared, name, avro_name, where, actual, version)
        if problem is not None:
            return problem
    return None


def _type_problem(place: str, declared: DeclaredField, name: str, avro_name: str, where: str, actual: str,
                  version: int) -> str | None:
    """Why the row's field `avro_name`, which `from_avro` reads as `actual`, does not read as `declared`, or None."""
    field = f"{place}: the field '{avro_name}' of {where}"
    try:
        spark = str(parse_type(actual))
    except ValueError as exc:  # a decimal beyond Spark's 38 digits
        return f"{field} reads as {actual}, which Spark cannot: {exc}"
    if spark in carriers(declared):
        return None
    if declared.converts:
        return (f"{field} reads as {actual}, which {'an epoch unit' if declared.unit else 'a format pattern'} does "
                f"not read; declare `{name}: {actual}`")
    if declared.sql_type.name in ("timestamp", "timestamp_ntz") and actual in ("int", "bigint"):
        return (f"{field} is an epoch number ({actual}); declare its unit, `{name}: {{type: timestamp_ntz, unit: us}}` "
                "for Debezium's MicroTimestamp (a timestamp column), `unit: ms` for Timestamp")
    return type_changed(place.split(".", 1)[0], name, avro_name, where, actual, declared.type, version)


def _column(value: Column, actual: str, field: DeclaredField) -> Column:
    """The declared column of a row field `from_avro` read as `actual`: as it is, converted (an epoch unit, a
    pattern), days since 1970-01-01, or cast from its text or number (null where that fails)."""
    from pyspark.sql import functions as F

    if field.converts:
        return converted(field, value.cast("string"))
    if actual == field.type:
        return value
    if field.sql_type.name == "date" and actual == "int":
        return F.date_from_unix_date(value)
    return value.try_cast(field.type)


class DebeziumAvroFormat(DebeziumFormat):
    """`{format: debezium, converter: avro, fields: {...}, subject: ..., version: latest}`: its columns, key check
    and change columns are `DebeziumFormat`'s, its bytes and schemas the `avro` format's."""

    uses_registry: ClassVar[bool] = True

    def __init__(self, spec: DebeziumSpec, schemas: RegistrySchemas | None = None) -> None:
        super().__init__(spec)
        self.schemas = schemas

    def bound(self, schemas: RegistrySchemas) -> DebeziumAvroFormat:
        """This format with the batch's schemas, which `decode` needs."""
        return DebeziumAvroFormat(self.spec, schemas)

    def subject(self, side: str, topics: list[str]) -> str | None:
        """`subject`, else the TopicNameStrategy's `<topic>-<side>` for a source of one topic."""
        if self.spec.subject is not None:
            return self.spec.subject
        return f"{topics[0]}-{side}" if len(topics) == 1 else None

    def reader_problem(self, reader: str, side: str, subject: str, version: int) -> str | None:
        where = f"the reader schema (subject '{subject}' version {version})"
        if side == "value":
            problem = envelope_problem(reader)
            if problem is not None:
                return f"value: {where} is not a Debezium change event's envelope: {problem}"
        try:
            available = row_fields(reader, side)
        except ValueError as exc:
            return f"{side}: {where} cannot be read as columns: {exc}"
        return field_problem(self.spec.fields, available, side, where, version)

    def decode(self, data: Column, subject: str) -> Decoded:
        """In layers: the writer id and the decoded envelope (`avro.wire_layers`); the operation, the source
        position and the row image; each field's column; the reason."""
        from pyspark.sql import functions as F

        schemas = self._schemas()

        def helper(what: str) -> str:
            return f"__mb_{subject}_dbz_avro_{what}"

        value_side = subject == "value"
        wire = wire_layers(data, schemas, helper("envelope"))
        env = F.col(helper("envelope"))
        decoded = env.getField(DECODED_MARK)
        if value_side:
            image = F.when(env.getField("op") == "d", env.getField("before")).otherwise(env.getField("after"))
            head = {helper("op"): env.getField("op"), helper("lsn"): env.getField("source").getField("lsn"),
                    helper("ts_ms"): env.getField("source").getField("ts_ms"), helper("row"): F.when(decoded, image)}
        else:
            head = {helper("row"): F.when(decoded, env)}
        row = F.col(helper("row"))
        available = row_fields(schemas.reader, subject)
        fields = list(self.spec.fields.items())
        values = {helper(f"value{i}"): _column(row.getField(field.read_from(name)), available[field.read_from(name)],
                                               field)
                  for i, (name, field) in enumerate(fields)}
        columns = {name: F.col(helper(f"value{i}")) for i, (name, _) in enumerate(fields)}
        unread = [F.when(row.getField(field.read_from(name)).isNotNull() & columns[name].isNull(),
                         F.lit(f"{subject} field '{name}' is not {field.article} {field.described}"))
                  for name, field in fields if field.converts or available[field.read_from(name)] != field.type]
        reason = wire_reason(data, schemas, subject, helper("envelope"))
        op = F.col(helper("op"))
        if value_side:
            reason = change_reason(reason, op, row, F.col(helper("lsn")))
        if unread:  # a string that is no timestamp, a decimal beyond the declared precision
            reason = reason.otherwise(F.when(F.coalesce(*unread).isNotNull(), F.concat_ws("; ", *unread)))
        judged = {helper("reason"): reason.cast("string")}
        if value_side:
            read = F.col(helper("reason")).isNull() & data.isNotNull()
            columns.update(change_columns(read, op, F.col(helper("lsn")), F.col(helper("ts_ms"))))
        return Decoded(columns=columns, reason=F.col(helper("reason")), helpers=(*wire, head, values, judged))

    def metrics(self, data: Column, side: str) -> dict[str, Column]:
        """One counter per bound writer schema: the records of this side that carry its id."""
        return writer_counts(data, side, self._schemas())

    def pins(self, metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The avro format's pins (`avro.registry_pins`), with the converter."""
        return {"format": self.name, "converter": "avro", **registry_pins(self._schemas(), self.spec.fields, metrics)}

    def _schemas(self) -> RegistrySchemas:
        if self.schemas is None:
            raise RuntimeError("a debezium format with converter avro decodes only once bound to the batch's schemas "
                               "(DebeziumAvroFormat.bound)")
        return self.schemas
