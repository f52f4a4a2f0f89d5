"""`avro`: Avro in the Confluent wire format, with its schemas in a schema registry.

A record's bytes are the magic byte 0, the writer schema's registry id (4 bytes, big-endian), then the Avro binary
encoding. The spec declares the columns the job gets (`fields`, Spark SQL types, as a Flink SQL table declares the
columns of its `avro-confluent` format); the registry has the schemas:

- the **reader schema** is a version of the subject (`<topic>-value` or `<topic>-key` by the TopicNameStrategy, or
  `subject`): `latest`, resolved when a batch is planned, or a pinned `version`. Each declared field must be a field
  of it with the Spark type the table in docs/formats.md gives (`spark_type`), else the plan refuses the batch;
- each record is decoded with its **writer schema** (by its id) into the reader schema: Avro's schema resolution
  (a field the writer lacks takes the reader's default). Spark's `from_avro` does it, given the payload without
  the header, the writer schema and the reader schema as `avroSchema`; one `from_avro` per writer schema, chosen
  by the id, so a batch may mix versions.

`AvroFormat(spec)` is what a spec loads (columns, checks); the stage binds it to the batch's schemas
(`AvroFormat.bound`, `RegistrySchemas`), which the plan pinned and the ledger keeps, so that a replay decodes the same
bytes with the same schemas even after the subject moved on or while the registry is down. A record that is
shorter than the header, has another magic byte, carries an id that is not one of the bound writer schemas, or
whose payload does not decode (truncated, a bad length or union index) is bad, with that reason: never a wrong row.
Avro's binary encoding has no checksum, so bytes that happen to decode are read as what they say, as every Avro
reader does (Kafka Connect's AvroConverter included); bytes after a complete record are ignored, as there too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from microbatch.formats.base import Decoded, Format, RegistrySchemas
from microbatch.formats.fields import DeclaredField, DeclaringSpec, converted
from microbatch.formats.sql_types import parse_type

if TYPE_CHECKING:
    from pyspark.sql import Column

    from microbatch.formats.inference import Sample, SampledSide

HEADER_BYTES = 5
"""The Confluent wire format's header: the magic byte 0 and the writer schema's id."""
DECODED_MARK = "__microbatch_decoded"
"""A boolean field added to the reader schema with the default true: Avro's resolution fills it in every record that
decodes, and Spark's `from_avro` (PERMISSIVE) gives a row of nulls for one that does not, so a null mark is the one
sure sign of a failed decode, even for a schema whose every field may be null."""

_PRIMITIVES = {"boolean": "boolean", "int": "int", "long": "bigint", "float": "float", "double": "double",
               "bytes": "binary", "string": "string"}
_LOGICAL = {("int", "date"): "date", ("long", "timestamp-millis"): "timestamp",
            ("long", "timestamp-micros"): "timestamp", ("long", "local-timestamp-millis"): "timestamp_ntz",
            ("long", "local-timestamp-micros"): "timestamp_ntz", ("string", "uuid"): "string"}
"""Logical types and the Spark type `from_avro` reads them as (decimal: `decimal(p,s)`, on bytes or fixed). A time of
day (`time-millis`, `time-micros`) is refused; any other logical type is read as its underlying type, as Avro's
specification says a reader must."""


class AvroField(DeclaredField):
    """One declared field: `name: type`, or `name: {type: T, from: avro_name}` to read another field of the
    record."""

    refused = ("variant", "an Avro field has a type of its own; declare the Spark type docs/formats.md gives for it "
               "instead of variant")

    @property
    def avro_name(self) -> str | None:
        """The field's name in the Avro record, when it differs from the column's name."""
        return self.source_name


class AvroSpec(DeclaringSpec):
    """`{format: avro, fields: {name: spark_sql_type, ...}, subject: ..., version: latest}`."""

    format: Literal["avro"] = "avro"
    payload = "Avro"
    fields: dict[str, AvroField] = Field(default_factory=dict, validate_default=True)
    """The columns the job gets, each a top-level field of the reader schema, in column order."""
    subject: str | None = None
    """The registry subject of the schemas; by default the TopicNameStrategy's `<topic>-value` (or `-key`), which
    needs a source of one listed topic."""
    version: int | Literal["latest"] = "latest"
    """The reader schema: the subject's `latest` version when a batch is planned (pinned in the batch), or a fixed
    version number."""

    @field_validator("version")
    @classmethod
    def _positive(cls, version: int | str) -> int | str:
        if isinstance(version, int) and version < 1:
            raise ValueError(f"{version} is not a schema version; versions count from 1, or write `latest`")
        return version

    def subject_for(self, side: str, topics: list[str]) -> str | None:
        """The subject of this side ("key" or "value"): `subject`, else `<topic>-<side>` for a source of one
        topic; None when it cannot be told (a source of several topics or a pattern)."""
        if self.subject is not None:
            return self.subject
        return f"{topics[0]}-{side}" if len(topics) == 1 else None


class AvroFormat(Format[AvroSpec]):
    name = "avro"
    spec_model = AvroSpec
    declares_names = True
    uses_registry: ClassVar[bool] = True
    guess_rank = 0

    @classmethod
    def looks_like(cls, sample: Sample) -> bool:
        """Every non-null value starts with the magic byte 0 and a schema id, as the Confluent wire format does."""
        return bool(sample.present) and all(len(d) >= HEADER_BYTES and d[0] == 0 for d in sample.present)

    @classmethod
    def infer(cls, sample: Sample) -> SampledSide:
        """The fields of the subject's latest schema (`sampled_fields`); raw (the bytes kept) when there is none
        (no registry configured, or no such subject)."""
        from microbatch.formats.raw import RawFormat

        schema = sample.latest_schema() if sample.latest_schema is not None else None
        if schema is None:
            return RawFormat.kept(sample, "raw: every one starts as Avro in the Confluent wire format does, but no "
                                  "schema registry answered for its subject; set MICROBATCH_SCHEMA_REGISTRY_URL to "
                                  "read it as avro")
        return sampled_fields(sample, schema, cls.name)

    def __init__(self, spec: AvroSpec, schemas: RegistrySchemas | None = None) -> None:
        super().__init__(spec)
        self.schemas = schemas

    def bound(self, schemas: RegistrySchemas) -> AvroFormat:
        """This format with the batch's schemas, which `decode` needs."""
        return AvroFormat(self.spec, schemas)

    def columns(self) -> dict[str, str]:
        return {name: field.type for name, field in self.spec.fields.items()}

    def subject(self, side: str, topics: list[str]) -> str | None:
        return self.spec.subject_for(side, topics)

    def reader_problem(self, reader: str, side: str, subject: str, version: int) -> str | None:
        return field_problem(self.spec, reader, side, subject, version)

    def decode(self, data: Column, subject: str) -> Decoded:
        from pyspark.sql import functions as F

        schemas = self._schemas()
        helper = f"__mb_{subject}_avro"
        layers = wire_layers(data, schemas, helper)
        row = F.col(helper)
        columns = {name: F.when(row.getField(DECODED_MARK), self._column(row.getField(field.read_from(name)), field))
                   for name, field in self.spec.fields.items()}
        reason = wire_reason(data, schemas, subject, helper)
        unread = [F.when(row.getField(field.read_from(name)).isNotNull() & columns[name].isNull(),
                         F.lit(f"{subject} field '{name}' is not {field.article} {field.described}"))
                  for name, field in self.spec.fields.items() if field.converts]
        if unread:  # an epoch number beyond year 9999, a string not in the declared pattern
            reason = reason.otherwise(F.when(F.coalesce(*unread).isNotNull(), F.concat_ws("; ", *unread)))
        return Decoded(columns=columns, reason=reason.cast("string"), helpers=layers)

    @staticmethod
    def _column(value: Column, field: AvroField) -> Column:
        """A decoded field as its declared column: cast, or (an epoch unit or a pattern) converted from its text."""
        return converted(field, value.cast("string")) if field.converts else value.cast(field.type)

    def metrics(self, data: Column, side: str) -> dict[str, Column]:
        """One counter per bound writer schema: the records of this side that carry its id."""
        return writer_counts(data, side, self._schemas())

    def pins(self, metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The subject, the reader version and id, and the writer schema ids the read met (by `metrics`, the
        values of `metrics()`); a spec's hash of the declared fields."""
        return {"format": self.name, **registry_pins(self._schemas(), self.spec.fields, metrics)}

    def _schemas(self) -> RegistrySchemas:
        if self.schemas is None:
            raise RuntimeError("an avro format decodes only once bound to the batch's schemas (AvroFormat.bound)")
        return self.schemas


def wire_layers(data: Column, schemas: RegistrySchemas, helper: str) -> tuple[dict[str, Column], ...]:
    """The helper layers of a wire-format decode: `<helper>_id`, the writer schema's id, then `<helper>`, the record
    decoded by its writer schema into the reader schema with `DECODED_MARK` (one `from_avro` per writer schema, chosen
    by the id; a struct of nulls, the mark included, where it does not decode)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    options = {"avroSchema": reader_with_mark(schemas.reader), "mode": "PERMISSIVE"}
    writer_id = F.col(f"{helper}_id")
    payload = F.substring(data, HEADER_BYTES + 1, 1 << 30)
    decoded: Column = F.lit(None)
    for writer, text in sorted(schemas.writers.items()):
        branch = from_avro(payload, text, options)
        decoded = F.when(writer_id == writer, branch) if writer == min(schemas.writers) \
            else decoded.when(writer_id == writer, branch)
    return {f"{helper}_id": schema_id(data)}, {helper: decoded}


def wire_reason(data: Column, schemas: RegistrySchemas, subject: str, helper: str) -> Column:
    """The reason of a wire-format record that does not decode, as a CASE a caller may go on with (`.when`,
    `.otherwise`): too short, another magic byte, an unknown writer id, a payload that does not decode (the record
    of `wire_layers(..., helper)` without its mark); null for a null `data`."""
    from pyspark.sql import functions as F

    writer_id, row = F.col(f"{helper}_id"), F.col(helper)
    source = f"{subject} (subject '{schemas.subject}')"
    return (F.when(data.isNull(), F.lit(None))
            .when(F.length(data) < HEADER_BYTES, f"{subject} is shorter than the 5-byte header of the Confluent wire "
                                                 "format")
            .when(F.substring(data, 1, 1) != F.lit(b"\x00"),
                  f"{subject} does not start with the magic byte 0 of the Confluent wire format (plain Avro without "
                  "the schema id, or not Avro)")
            .when(~writer_id.isin(*schemas.writers) if schemas.writers else F.lit(True),
                  F.concat(F.lit(f"{subject}'s schema id "), writer_id.cast("string"),
                           F.lit(f" is not a schema of subject '{schemas.subject}' this batch knows")))
            .when(row.getField(DECODED_MARK).isNull(),
                  F.concat(F.lit(f"{source}'s Avro payload does not decode with its writer schema (id "),
                           writer_id.cast("string"), F.lit(f") into the reader schema (version {schemas.version})"))))


def writer_counts(data: Column, side: str, schemas: RegistrySchemas) -> dict[str, Column]:
    """One counter per bound writer schema: the records of this side that carry its id."""
    from pyspark.sql import functions as F

    found = schema_id(data)
    return {f"{side}_schema_{writer}": F.count(F.when(found == writer, True)) for writer in sorted(schemas.writers)}


def registry_pins(schemas: RegistrySchemas, fields: Mapping[str, DeclaredField],
                  metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """The subject, the reader version and id, the writer schema ids the read met (by `metrics`, the values of
    `writer_counts`: both sides' when both read a registry, so only this side's bound writers count), and a hash of
    the declared `fields`."""
    declared = [[name, field.type, field.read_from(name), *([field.unit or field.format] if field.converts else [])]
                for name, field in fields.items()]
    counted = {int(name.rsplit("_", 1)[1]) for name, count in (metrics or {}).items() if "_schema_" in name and count}
    met = sorted(counted & set(schemas.writers))
    digest = hashlib.sha256(json.dumps(declared).encode()).hexdigest()
    return {**schemas.pins(), "writers": met, "fields_sha256": digest}


def schema_id(data: Column) -> Column:
    """The writer schema's id in the header of `data` (bytes 2 to 5, big-endian); null for a value shorter than
    the header or without the magic byte 0."""
    from pyspark.sql import functions as F

    header = (F.length(data) >= HEADER_BYTES) & (F.substring(data, 1, 1) == F.lit(b"\x00"))
    return F.when(header, F.conv(F.hex(F.substring(data, 2, 4)), 16, 10).cast("bigint"))


def reader_with_mark(reader: str) -> str:
    """The reader schema with `DECODED_MARK` (boolean, default true) as its last field."""
    schema = json.loads(reader)
    return json.dumps({**schema, "fields": [*schema["fields"], {"name": DECODED_MARK, "type": "boolean",
                                                                  "default": True}]})


def spark_type(schema: Any, named: dict[str, Any] | None = None, namespace: str = "") -> str:  # noqa: PLR0911
    """The Spark SQL type `from_avro` reads an Avro schema (parsed JSON) as; ValueError with one sentence for what
    it cannot read as a column (a union of several non-null types, a recursive record).

    boolean, int, long -> bigint, float, double, bytes and fixed -> binary, string and enum -> string; date,
    timestamp-millis/micros -> timestamp, local-timestamp-millis/micros -> timestamp_ntz, decimal(p,s), uuid ->
    string; record -> struct, array -> array, map -> map<string,T>; a union of null and one type -> that type."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        if full in named or schema in named:
            target = named.get(full, named.get(schema))
            if target is _IN_PROGRESS:
                raise ValueError(f"the record '{schema}' contains itself, which a Spark column cannot hold")
            return str(target)
        raise ValueError(f"'{schema}' is not an Avro type this schema defines")
    if isinstance(schema, list):
        members = [member for member in schema if member != "null"]
        if len(members) != 1:
            raise ValueError("a union of several types other than null has no one Spark type; read the field "
                             "in a Python job from `value`")
        return spark_type(members[0], named, namespace)
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in ("time-millis", "time-micros"):
        raise ValueError(f"{logical} (a time of day) has no column type here; read the field in a Python job")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if kind == "fixed":
            _name(schema, named, namespace, f"decimal({schema['precision']},{schema.get('scale', 0)})")
        return f"decimal({schema['precision']},{schema.get('scale', 0)})"
    if isinstance(kind, str) and (kind, logical) in _LOGICAL:
        return _LOGICAL[(kind, logical)]
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "enum":
        return _name(schema, named, namespace, "string")
    if kind == "fixed":
        return _name(schema, named, namespace, "binary")
    if kind == "array":
        return f"array<{spark_type(schema['items'], named, namespace)}>"
    if kind == "map":
        return f"map<string,{spark_type(schema['values'], named, namespace)}>"
    if kind == "record":
        full = _full_name(schema, namespace)
        named[full] = _IN_PROGRESS
        inner = schema.get("namespace", full.rpartition(".")[0])
        fields = [f"{f['name']}:{spark_type(f['type'], named, inner)}" for f in schema["fields"]]
        named[full] = "struct<" + ",".join(fields) + ">"
        return str(named[full])
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in named):
        return spark_type(kind, named, namespace)
    raise ValueError(f"'{kind}' is not an Avro type")


_IN_PROGRESS = object()


def _full_name(schema: Mapping[str, Any], namespace: str) -> str:
    name = str(schema["name"])
    space = schema.get("namespace", namespace)
    return name if "." in name or not space else f"{space}.{name}"


def _name(schema: Mapping[str, Any], named: dict[str, Any], namespace: str, spark: str) -> str:
    named[_full_name(schema, namespace)] = spark
    return spark


def reader_fields(reader: str) -> dict[str, str]:
    """The top-level fields of a reader schema, name -> Spark SQL type; ValueError with one sentence when the
    schema is not a record, or a field has no Spark type."""
    schema = json.loads(reader)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError("its schema is not an Avro record, so it has no fields to declare; read a string key with "
                         "`key: text`")
    named: dict[str, Any] = {}
    namespace = schema.get("namespace", _full_name(schema, "").rpartition(".")[0])
    named[_full_name(schema, "")] = _IN_PROGRESS
    fields: dict[str, str] = {}
    for each in schema["fields"]:
        try:
            fields[each["name"]] = spark_type(each["type"], named, namespace)
        except ValueError as exc:
            fields[each["name"]] = f"!{exc}"
    return fields


def field_problem(spec: AvroSpec, reader: str, side: str, subject: str, version: int) -> str | None:
    """Why the declared fields cannot be read from this reader schema (`subject` `version`), in one sentence
    naming the field and what to declare; None when each is a field of it with the declared type."""
    where = f"the reader schema (subject '{subject}' version {version})"
    try:
        available = reader_fields(reader)
    except ValueError as exc:
        return f"{side}: {where} cannot be read as columns: {exc}"
    for name, declared in spec.fields.items():
        avro_name = declared.read_from(name)
        if avro_name not in available:
            return (f"{side}.fields.{name}: '{avro_name}' is not a field of {where}; its fields are "
                    f"{', '.join(available)}; declare one of them, or read another name with `from`")
        actual = available[avro_name]
        if actual.startswith("!"):
            return f"{side}.fields.{name}: the field '{avro_name}' of {where} cannot be a column: {actual[1:]}"
        if declared.converts:  # read from the payload's number or string, converted (formats/fields.converted)
            carriers = ("int", "bigint", "string") if declared.unit is not None else ("string",)
            if str(parse_type(actual)) not in carriers:
                return (f"{side}.fields.{name}: the field '{avro_name}' of {where} reads as {actual}, which "
                        f"{'an epoch unit' if declared.unit else 'a format pattern'} does not read; declare "
                        f"`{name}: {actual}`")
        elif str(parse_type(actual)) != declared.type:
            return type_changed(side, name, avro_name, where, actual, declared.type, version)
    return None


def type_changed(side: str, name: str, avro_name: str, where: str, actual: str, declared: str, version: int) -> str:
    """The sentence for a declared field whose reader schema's type differs: for a first version, declare its type;
    after one, first the fix for a new version that changed the type (pin the reader version, or a new column, which
    `microbatch migrate` adds), since declaring the new type would not fit the sink's column."""
    problem = f"{side}.fields.{name}: the field '{avro_name}' of {where} reads as {actual}, not {declared}"
    if version <= 1:
        return f"{problem}; declare `{name}: {actual}`"
    renamed = f"{name}_{re.sub(r'[^a-z0-9]+', '_', actual.lower()).strip('_')}"
    return (f"{problem}; if a newer version changed its type, pin the reader schema to the last version where it is "
            f"{declared} (`version: N` in source.{side}, docs/formats.md) and the sink keeps its column, or read it "
            f"under a new name (`{renamed}: {{type: {actual}, from: {avro_name}}}` and a sink column of that name, "
            f"which `microbatch migrate` adds: it never changes a column's type); else declare `{name}: {actual}`")


def sampled_fields(sample: Sample, schema: str, fmt: str) -> SampledSide:
    """The format `fmt` (avro) of a side whose subject's latest schema is `schema`: each top-level field that has a
    column type (`reader_fields`), under a snake_case name; nested records, arrays and maps go to the sink as JSON
    text."""
    from microbatch.formats.inference import INFER_RESERVED, SampledColumn, SampledSide, quote_sql, snake_case, unique

    side = sample.side
    fields: dict[str, Any] = {}
    columns: list[SampledColumn] = []
    skipped: list[str] = []
    prefix = "" if side == "value" else "key_"
    for avro_name, spark in reader_fields(schema).items():
        if spark.startswith("!"):
            skipped.append(avro_name)
            continue
        field = snake_case(avro_name)
        if field in INFER_RESERVED:
            field = f"payload_{field}"
        field = unique(field, {name.removeprefix(prefix) for name in sample.records} | set(fields))
        column = f"{prefix}{field}"
        sample.records.add(column)
        fields[field] = spark if field == avro_name else {"type": spark, "from": avro_name}
        if spark.startswith(("struct", "array", "map")):
            columns.append(SampledColumn(column, "string", f"to_json({quote_sql(column)})",
                                         f"{side}.{avro_name} ({spark}, as JSON text)"))
        else:
            columns.append(SampledColumn(column, spark, quote_sql(column), f"{side}.{avro_name} ({spark})"))
    summary = f"{fmt}: the Confluent wire format; {len(fields)} field(s) of the subject's latest schema"
    if skipped:
        summary += f" ({', '.join(skipped)} left out: no column type; read them in a Python job)"
    return SampledSide(fmt, {"format": fmt, "fields": fields}, tuple(columns), summary)
