"""`json`: a JSON object whose declared fields become typed columns.

The strict path parses the value into a VARIANT (`try_parse_json`); each declared field is looked up in it by its
JSON name, so the decode tells apart what `from_json` cannot:

- **absent** (`try_variant_get(doc, path, 'variant')` is SQL null) or JSON `null` (`is_variant_null`): the
  column is null; a `required` field makes the record bad ("value lacks the required field 'id'", "value field
  'id' is null but required");
- **of another type**: the JSON kind of the field (`schema_of_variant` of the field alone) does not fit the
  declared type, or the value does not fit its range: "value field 'amount_cents' is not a bigint".

What fits each type (Spark's variant casts alone are lenient: they turn "12" into an int and 1.5 into 1):
string: a JSON string; boolean: true/false; tinyint..bigint: a JSON integer in range (1.0 is not one);
float, double: any number; decimal(p,s): any number whose integer part fits p-s digits, rounded half up to s
places as Spark's cast does; date, timestamp, timestamp_ntz: a string that Spark's cast reads (ISO-8601; a
timestamp without an offset is in the session time zone); array<T>, map<string,T>, struct<...>: an array or
object whose every non-null element or field fits; variant: anything. A value that is not valid UTF-8, not JSON
(a lone surrogate escape included) or not a JSON object makes the record bad as a whole. An object that repeats
a key, at any depth, is read with the last value of that key, as `from_json` does (`SQL_CONF`: parse_json keeps
the last one too, where otherwise it would refuse the value). Undeclared fields are ignored.

Fast path: `from_json` (one Jackson pass; strings, dates and timestamps read as text, booleans, integers and
doubles as declared, other types as a VARIANT) decodes a record whose every field it can vouch for: the value is
valid UTF-8 with no `\\u` escape of a surrogate (which from_json would read, parse_json refuses), nothing failed
to convert, no required field is missing, and no text read into a string could be a number's, true's, false's, an
array's or an object's. Only the other records (bad ones, or e.g. a string field holding "12") are parsed into a
VARIANT and checked as above. The decode is in layers (`Decoded.helpers`, one select each: the fast path; the
document, parsed only for a record the fast path does not vouch for; each field's element; its checks; its column
and problem), so that each is computed once a record: Spark shares no subexpression inside a CASE branch, and a
lambda would keep the whole projection out of whole-stage code generation (docs/performance.md).
tests/integration/test_formats_decode.py checks both paths give the same decode.

On the JVM (`on_jvm`, where the stage's Spark has the formats jar: `formats/jvm.py`), a spec whose every field is a
string, boolean, tinyint..bigint, double, decimal, date, timestamp or timestamp_ntz decodes in one pass instead:
the Java function include/jvm/microbatch/formats/JsonDecoder.java reads the bytes once with Jackson's byte parser
(which knows a string token from a number's) and checks each declared field as it reads it, by the rules above;
dates, timestamps and decimals come out as their JSON text, which Spark's cast then reads (`try_cast`), so they
read as above. The same test holds that decode equal to the one above on every value of its corpus.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from microbatch.formats.base import Decoded, Format, JavaFunction
from microbatch.formats.fields import DeclaredField, DeclaringSpec, converted
from microbatch.formats.jvm import JSON_DECODER
from microbatch.formats.sql_types import INTEGERS, SqlType

if TYPE_CHECKING:
    from pyspark.sql import Column

    from microbatch.formats.inference import Sample, SampledSide

_NUMBERS = ("float", "double", "decimal")
_TEXT = ("string", "date", "timestamp", "timestamp_ntz")
"""Types the fast path reads as text: from_json gives any JSON value's text, so the text must not be one a number,
true, false, an array or an object could have written."""
_NATIVE = ("boolean", *sorted(INTEGERS), "double")
"""Types the fast path reads as they are: from_json refuses any other JSON kind (and, as Spark's variant, reads a
number's double correctly rounded)."""
_FROM_JSON_OPTIONS = {"mode": "PERMISSIVE", "allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}
"""from_json's leniencies that parse_json does not have, turned off (a record the two disagree on is not vouched)."""
_NOT_A_STRING = r"^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$"
"""The text from_json gives a JSON number read into a string field."""
_SURROGATE_ESCAPE = r"\\u[dD][89a-fA-F]"
"""An escape of a UTF-16 surrogate (or a text with an escaped backslash before "ud8"): from_json reads a lone one,
parse_json refuses it, so such a value takes the strict path."""
SQL_CONF = {"spark.sql.variant.allowDuplicateKeys": "true"}
"""parse_json keeps the last of a repeated key, as from_json does (Spark reads it when it plans the query)."""
_JVM_KINDS = {"string": 0, "date": 1, "timestamp": 1, "timestamp_ntz": 1, "boolean": 2, "tinyint": 3,
              "smallint": 4, "int": 5, "bigint": 6, "double": 7, "decimal": 8}
"""The types JsonDecoder.java reads, to its kinds (its constants); 1 and 8: the JSON text, for Spark's cast."""
_JVM_EPOCH = 9
"""JsonDecoder.java's kind of an epoch number's field (`unit`): a JSON integer's or string's text."""
_JVM_TEXT = (1, 8, _JVM_EPOCH)


class JsonField(DeclaredField):
    """One declared field: `name: type`, or `name: {type: T, from: json_name}` to read another JSON name."""

    refused = ("binary", "JSON has no binary type; read the field as a string (e.g. base64) and decode it in the job")

    @field_validator("source_name")
    @classmethod
    def _path_safe(cls, name: str | None) -> str | None:
        if name is not None and (("'" in name and '"' in name) or not name):
            raise ValueError(f"'{name}' cannot be read as a JSON name (empty, or holds both ' and \")")
        return name

    @property
    def json_name(self) -> str | None:
        """The field's name in the JSON object, when it differs from the column's name."""
        return self.source_name


class JsonSpec(DeclaringSpec):
    """`{format: json, fields: {name: spark_sql_type, ...}, required: [name, ...]}`."""

    format: Literal["json"] = "json"
    payload = "JSON"
    fields: dict[str, JsonField] = Field(default_factory=dict, validate_default=True)
    """Each column's Spark SQL type, in column order; the JSON name is the column's unless `from` gives it."""
    required: list[str] = Field(default_factory=list)
    """Fields a record must have, not null; a missing optional field is null."""

    @field_validator("required")
    @classmethod
    def _required_declared(cls, required: list[str], info: ValidationInfo) -> list[str]:
        fields = info.data.get("fields")
        for name in required if fields is not None else []:
            if name not in fields:
                raise ValueError(f"'{name}' is not a declared field; declare it in fields or remove it from required")
        return required


def _path(name: str) -> str:
    """A variant path to the top-level field `name`, quoted so any JSON name is read as it is."""
    return f'$["{name}"]' if "'" in name else f"$['{name}']"


def fits(element: Column, kind: SqlType) -> Column:
    """True where `element`, a variant that is neither SQL null nor JSON null, holds a value of `kind`."""
    from pyspark.sql import functions as F

    if kind.name in ("array", "map"):
        assert kind.element is not None
        element_kind = kind.element
        items = F.try_variant_get(element, "$", "array<variant>") if kind.name == "array" \
            else F.map_values(F.try_variant_get(element, "$", "map<string,variant>"))
        return F.coalesce(F.forall(items, lambda item: F.is_variant_null(item) | fits(item, element_kind)),
                          F.lit(False))
    if kind.name == "struct":
        checks = [F.try_variant_get(element, "$", "struct<>").isNotNull()]
        for name, field_kind in kind.fields:
            child = F.try_variant_get(element, _path(name), "variant")
            checks.append(child.isNull() | F.is_variant_null(child) | fits(child, field_kind))
        return _all(checks)
    return _fits_atomic(element, kind)


def _fits_atomic(element: Column, kind: SqlType) -> Column:
    from pyspark.sql import functions as F

    json_kind = F.schema_of_variant(element)
    converted = F.try_variant_get(element, "$", str(kind)).isNotNull()
    if kind.name == "variant":
        return F.lit(True)
    if kind.name in ("string", "boolean"):
        return json_kind == kind.name.upper()
    if kind.name in INTEGERS:
        return (json_kind == "BIGINT") & converted
    if kind.name in _NUMBERS:
        return (json_kind.isin("BIGINT", "DOUBLE") | json_kind.startswith("DECIMAL")) & converted
    return (json_kind == "STRING") & converted  # date, timestamp, timestamp_ntz: a string Spark's cast reads


def _maybe_not_a_string(text: Column) -> Column:
    """True where `text`, what from_json read into a string, may be the text of a JSON number, true, false, array or
    object rather than of a JSON string; cheap tests first, the pattern only for a text starting like a number."""
    return (text.isin("true", "false") | text.startswith("[") | text.startswith("{")
            | ((text >= "-") & (text < ":") & ~text.contains(":") & text.rlike(_NOT_A_STRING)))


def _native_type(spec: JsonSpec, json_name: str) -> str | None:
    """The one type every field read from `json_name` declares, else None."""
    kinds = {field.type for name, field in spec.fields.items() if field.read_from(name) == json_name}
    return kinds.pop() if len(kinds) == 1 else None


def _not_a(subject: str, name: str, field: JsonField) -> str:
    """The reason of a field of another type (JsonDecoder.java writes the same sentence)."""
    return f"{subject} field '{name}' is not {field.article} {field.described}"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _all(checks: list[Column]) -> Column:
    combined = checks[0]
    for check in checks[1:]:
        combined = combined & check
    return combined


class JsonFormat(Format[JsonSpec]):
    name = "json"
    spec_model = JsonSpec
    declares_names = True
    jvm: ClassVar[bool] = False
    """True in the class `on_jvm` gives: `decode` calls JsonDecoder.java."""
    guess_rank = 1

    @classmethod
    def looks_like(cls, sample: Sample) -> bool:
        """Every non-null value is a JSON object as Spark reads one (`formats/json_inference.py`)."""
        from microbatch.formats import json_inference

        return json_inference.all_objects(sample)

    @classmethod
    def infer(cls, sample: Sample) -> SampledSide:
        """Fields typed across the sample, `required` where every object has them non-null."""
        from microbatch.formats import json_inference

        return json_inference.infer(sample, cls.name)

    def columns(self) -> dict[str, str]:
        return {name: field.type for name, field in self.spec.fields.items()}

    def on_jvm(self) -> JsonFormat:
        fields = self.spec.fields.items()  # a format pattern is one line: the plan's separators are tab and newline
        if not all(f.sql_type.name in _JVM_KINDS and not {"\t", "\n"} & set(name + f.read_from(name))
                   for name, f in fields):
            return self
        return _JvmJsonFormat(self.spec)

    def decode(self, data: Column, subject: str) -> Decoded:
        """The fast path's decode where it vouches for the record, else the strict path's; each in layers of helpers
        (`Decoded.helpers`), so that a record's document, each field's element and each check is computed once."""
        from pyspark.sql import functions as F

        def helper(what: str) -> str:
            return f"__mb_{subject}_{what}"

        fields = list(self.spec.fields.items())
        vouched, fast = self._fast_path(data, self._from_json(data))
        vouched_column = F.col(helper("vouched"))
        document = F.try_parse_json(F.when(~vouched_column & F.is_valid_utf8(data), data.cast("string")))
        doc = F.col(helper("document"))
        elements = {helper(f"element{i}"): F.try_variant_get(doc, _path(field.read_from(name)), "variant")
                    for i, (name, field) in enumerate(fields)}
        elements[helper("object")] = F.try_variant_get(doc, "$", "struct<>").isNotNull()
        checks, judged, columns, problems = {}, {}, {}, []
        for i, (name, field) in enumerate(fields):
            element = F.col(helper(f"element{i}"))
            if field.converts:  # an epoch number or a time string in a pattern: read as text, then converted
                value = converted(field, F.try_variant_get(element, "$", "string"))
                kinds = ("STRING", "BIGINT") if field.unit is not None else ("STRING",)
                checks[helper(f"fits{i}")] = F.schema_of_variant(element).isin(*kinds) & value.isNotNull()
                checks[helper(f"value{i}")] = value
            else:
                checks[helper(f"fits{i}")] = fits(element, field.sql_type)
                checks[helper(f"value{i}")] = element if field.sql_type.name == "variant" \
                    else F.try_variant_get(element, "$", field.type)
            absent, null, good = element.isNull(), F.is_variant_null(element), F.col(helper(f"fits{i}"))
            judged[helper(f"strict{i}")] = F.when(~absent & ~null & good, F.col(helper(f"value{i}"))).cast(field.type)
            problem = F.when(~absent & ~null & ~good, _not_a(subject, name, field))
            if name in self.spec.required:
                problem = (F.when(absent, f"{subject} lacks the required field '{name}'")
                           .when(null, f"{subject} field '{name}' is null but required").otherwise(problem))
            judged[helper(f"problem{i}")] = problem
            columns[name] = F.when(vouched_column, F.col(helper(f"fast{i}"))).otherwise(F.col(helper(f"strict{i}")))
            problems.append(F.col(helper(f"problem{i}")))
        layers = ({helper("vouched"): vouched, **{helper(f"fast{i}"): column for i, column in enumerate(fast)}},
                  {helper("document"): document}, elements, checks, judged)
        reason = (F.when(vouched_column | data.isNull(), F.lit(None))
                  .when(~F.is_valid_utf8(data), f"{subject} is not valid UTF-8")
                  .when(doc.isNull(), f"{subject} is not JSON")
                  .when(~F.col(helper("object")), f"{subject} is not a JSON object")
                  .otherwise(F.when(F.coalesce(*problems).isNotNull(), F.concat_ws("; ", *problems))))
        return Decoded(columns=columns, reason=reason.cast("string"), helpers=layers, sql_conf=SQL_CONF)

    def _reads(self) -> dict[str, str]:
        """How the fast path's `from_json` reads each declared JSON name: `text` (a string, a date or a
        timestamp: from_json gives any JSON value's text), `native` (the declared type: from_json refuses any
        other JSON kind), or `variant` (checked by `fits`, as the strict path does)."""
        reads: dict[str, str] = {}
        for name, field in self.spec.fields.items():
            kind = field.sql_type.name
            read = "text" if kind in _TEXT or field.converts else "native" if kind in _NATIVE else "variant"
            json_name = field.read_from(name)
            if reads.get(json_name, read) != read or (json_name in reads and read == "native"
                                                       and _native_type(self.spec, json_name) is None):
                read = "variant"
            reads[json_name] = read
        return reads

    def _corrupt(self) -> str:
        """The name of from_json's column of a record it cannot read: one no declared JSON name takes."""
        reads = self._reads()
        return next(name for name in (f"_unreadable{'_' * n}" for n in range(len(reads) + 1)) if name not in reads)

    def _from_json(self, data: Column) -> Column:
        """The fast path's one Jackson pass: each declared JSON name read as `_reads` says, and `_corrupt`."""
        from pyspark.sql import functions as F

        types = {json_name: _native_type(self.spec, json_name) if read == "native" else
                 "string" if read == "text" else "variant" for json_name, read in self._reads().items()}
        corrupt = self._corrupt()
        schema = ", ".join(f"{_quote(json_name)} {kind}" for json_name, kind in [*types.items(), (corrupt, "string")])
        return F.from_json(data.cast("string"), schema, {**_FROM_JSON_OPTIONS, "columnNameOfCorruptRecord": corrupt})

    def _fast_path(self, data: Column, parsed: Column) -> tuple[Column, list[Column]]:
        """(whether `parsed`, what `_from_json` read, decodes the record as the strict path would, never null; the
        decode it gives, a column a declared field)."""
        from pyspark.sql import functions as F

        reads = self._reads()
        text = data.cast("string")
        checks = [data.isNotNull(), parsed.isNotNull(), parsed.getField(self._corrupt()).isNull(),
                  F.is_valid_utf8(data), ~(text.contains("\\u") & text.rlike(_SURROGATE_ESCAPE))]
        columns = []
        for name, field in self.spec.fields.items():
            kind = field.sql_type
            raw = parsed.getField(field.read_from(name))
            read = reads[field.read_from(name)]
            if read == "native":
                value, good = raw, None
            elif read == "text" and field.unit is not None:  # a JSON integer's text or a string's: the same digits
                value = converted(field, raw)
                good = raw.isNull() | value.isNotNull()
            elif read == "text":
                value = raw if kind.name == "string" else converted(field, raw)
                good = raw.isNull() | ~_maybe_not_a_string(raw)
                if kind.name != "string":
                    good = good & (raw.isNull() | value.isNotNull())
            else:
                present = raw.isNotNull() & ~F.is_variant_null(raw)
                good = ~present | fits(raw, kind)
                value = F.when(present, raw if kind.name == "variant" else F.try_variant_get(raw, "$", field.type))
                if name in self.spec.required:
                    checks.append(present)
            if name in self.spec.required:
                checks.append(raw.isNotNull())
            if good is not None:
                checks.append(good)
            columns.append(value.cast(field.type))
        return F.coalesce(_all(checks), F.lit(False)), columns

    def _decode_jvm(self, data: Column, subject: str) -> Decoded:
        """JsonDecoder.java's one pass: a struct of the columns (dates, timestamps and decimals as their JSON text),
        each field's problem and the record's; then Spark's cast of the texts, in a layer of its own since each
        cast is both a column and, where it fails, a problem."""
        from pyspark.sql import functions as F

        fields = list(self.spec.fields.items())
        kinds = [_JVM_EPOCH if field.unit is not None else _JVM_KINDS[field.sql_type.name] for _, field in fields]
        plan = "\n".join([subject, *(f"{name}\t{field.read_from(name)}\t{kind}\t{field.described}\t"
                                      f"{int(name in self.spec.required)}"
                                      for (name, field), kind in zip(fields, kinds, strict=True))])
        returns = ", ".join([*(f"c{i} {'string' if kind in _JVM_TEXT else field.type}"
                               for i, ((_, field), kind) in enumerate(zip(fields, kinds, strict=True))),
                             *(f"p{i} string" for i in range(len(fields))), "e string"])
        function = "microbatch_json_" + hashlib.sha256(f"{plan}|{returns}".encode()).hexdigest()[:16]
        decoded = f"__mb_{subject}_jvm"
        out = F.col(decoded)
        casts = {f"__mb_{subject}_cast{i}": converted(field, out.getField(f"c{i}"))
                 for i, ((_, field), kind) in enumerate(zip(fields, kinds, strict=True)) if kind in _JVM_TEXT}
        columns, problems = {}, []
        for i, ((name, field), kind) in enumerate(zip(fields, kinds, strict=True)):
            problem = out.getField(f"p{i}")
            if kind in _JVM_TEXT:
                cast = F.col(f"__mb_{subject}_cast{i}")
                problem = F.coalesce(problem, F.when(out.getField(f"c{i}").isNotNull() & cast.isNull(), F.lit(
                    _not_a(subject, name, field))))
                columns[name] = cast
            else:
                columns[name] = out.getField(f"c{i}")
            problems.append(problem)
        reason = (F.when(out.getField("e").isNotNull(), out.getField("e"))
                  .when(F.coalesce(*problems).isNotNull(), F.concat_ws("; ", *problems)))
        helpers = ({decoded: F.call_function(function, data, F.lit(bytearray(plan.encode())))},
                   *([casts] if casts else []))
        return Decoded(columns=columns, reason=reason.cast("string"), helpers=helpers,
                       functions={function: JavaFunction(JSON_DECODER, f"struct<{returns}>")})

    def pins(self, metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        declared = {"fields": [[name, field.type, field.read_from(name),
                                *([field.unit or field.format] if field.converts else [])]
                               for name, field in self.spec.fields.items()],
                    "required": sorted(self.spec.required)}
        digest = hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()
        return {"format": self.name, "fields_sha256": digest}


class _JvmJsonFormat(JsonFormat):
    """The json format decoding with JsonDecoder.java (`JsonFormat.on_jvm`)."""

    jvm = True

    def on_jvm(self) -> JsonFormat:
        return self

    def decode(self, data: Column, subject: str) -> Decoded:
        return self._decode_jvm(data, subject)
