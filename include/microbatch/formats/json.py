"""`json`: a JSON object whose declared fields become typed columns.

The value is parsed once into a VARIANT (`try_parse_json`); each declared field is looked up in it by its JSON
name, so the decode tells apart what `from_json` cannot:

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
(Spark's parser also refuses an object that repeats a key) or not a JSON object makes the record bad as a whole.
Undeclared fields are ignored.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from microbatch.formats.base import Decoded, Format, FormatSpec
from microbatch.formats.sql_types import INTEGERS, KNOWN_TYPES, SqlType, parse_type
from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import Column

RESERVED_NAMES = (*RECORD_COLUMNS, HEADERS_COLUMN)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_NUMBERS = ("float", "double", "decimal")


class JsonField(BaseModel):
    """One declared field: `name: type`, or `name: {type: T, from: json_name}` to read another JSON name."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type: str
    json_name: str | None = Field(default=None, alias="from")
    """The field's name in the JSON object, when it differs from the column's name."""

    @field_validator("type")
    @classmethod
    def _spark_type(cls, text: str) -> str:
        try:
            return str(parse_type(text))
        except ValueError as exc:
            raise ValueError(f"{exc}; use one of {KNOWN_TYPES}") from None

    @field_validator("json_name")
    @classmethod
    def _path_safe(cls, name: str | None) -> str | None:
        if name is not None and (("'" in name and '"' in name) or not name):
            raise ValueError(f"'{name}' cannot be read as a JSON name (empty, or holds both ' and \")")
        return name

    @property
    def sql_type(self) -> SqlType:
        return parse_type(self.type)


class JsonSpec(FormatSpec):
    """`{format: json, fields: {name: spark_sql_type, ...}, required: [name, ...]}`."""

    format: Literal["json"] = "json"
    fields: dict[str, JsonField] = Field(default_factory=dict, validate_default=True)
    """Each column's Spark SQL type, in column order; the JSON name is the column's unless `from` gives it."""
    required: list[str] = Field(default_factory=list)
    """Fields a record must have, not null; a missing optional field is null."""

    @field_validator("fields", mode="before")
    @classmethod
    def _short_form(cls, fields: Any) -> Any:
        if isinstance(fields, dict):
            return {name: {"type": kind} if isinstance(kind, str) else kind for name, kind in fields.items()}
        return fields

    @field_validator("fields")
    @classmethod
    def _names(cls, fields: dict[str, JsonField]) -> dict[str, JsonField]:
        if not fields:
            raise ValueError("declare at least one field as `name: spark_sql_type`, e.g. `payment_id: string`")
        seen: dict[str, str] = {}
        for name, field in fields.items():
            if not _NAME.fullmatch(name):
                raise ValueError(f"'{name}' is not a column name (letters, digits and _, not starting with a digit, "
                                 f"at most 63); name the column so and read the JSON name with `from`, e.g. "
                                 f"`{_suggest(name)}: {{type: {field.type}, from: \"{name}\"}}`")
            if name.lower() in RESERVED_NAMES:
                raise ValueError(f"'{name}' is the name of a record column; rename the decoded column and read the "
                                 f"JSON field with `from`, e.g. `payload_{name.lower()}: {{type: {field.type}, "
                                 f"from: {name}}}`")
            if name.lower() in seen:
                raise ValueError(f"'{seen[name.lower()]}' and '{name}' differ only in case, which Spark's column "
                                 "names do not tell apart; rename one and read its JSON name with `from`")
            seen[name.lower()] = name
        return fields

    @field_validator("required")
    @classmethod
    def _required_declared(cls, required: list[str], info: ValidationInfo) -> list[str]:
        fields = info.data.get("fields")
        for name in required if fields is not None else []:
            if name not in fields:
                raise ValueError(f"'{name}' is not a declared field; declare it in fields or remove it from required")
        return required


def _suggest(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "field"
    return f"_{cleaned}" if cleaned[0].isdigit() else cleaned


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


def _all(checks: list[Column]) -> Column:
    combined = checks[0]
    for check in checks[1:]:
        combined = combined & check
    return combined


class JsonFormat(Format[JsonSpec]):
    name = "json"
    spec_model = JsonSpec
    declares_names = True

    def columns(self) -> dict[str, str]:
        return {name: field.type for name, field in self.spec.fields.items()}

    def decode(self, data: Column, subject: str) -> Decoded:
        from pyspark.sql import functions as F

        valid_utf8 = F.is_valid_utf8(data)
        document = F.try_parse_json(F.when(valid_utf8, data.cast("string")))
        columns: dict[str, Column] = {}
        problems: list[Column] = []
        for name, field in self.spec.fields.items():
            element = F.try_variant_get(document, _path(field.json_name or name), "variant")
            present = element.isNotNull() & ~F.is_variant_null(element)
            good = fits(element, field.sql_type)
            value = element if field.sql_type.name == "variant" else F.try_variant_get(element, "$", field.type)
            columns[name] = F.when(present & good, value)
            problem = F.when(present & ~good, f"{subject} field '{name}' is not {field.sql_type.article} {field.type}")
            if name in self.spec.required:
                problem = (F.when(element.isNull(), f"{subject} lacks the required field '{name}'")
                           .when(F.is_variant_null(element), f"{subject} field '{name}' is null but required")
                           .otherwise(problem))
            problems.append(problem)
        reason = (F.when(data.isNull(), F.lit(None))
                  .when(~valid_utf8, f"{subject} is not valid UTF-8")
                  .when(document.isNull(), f"{subject} is not JSON")
                  .when(F.try_variant_get(document, "$", "struct<>").isNull(), f"{subject} is not a JSON object")
                  .otherwise(F.nullif(F.concat_ws("; ", *problems), F.lit(""))))
        return Decoded(columns=columns, reason=reason)

    def pins(self) -> dict[str, str]:
        declared = {"fields": [[name, field.type, field.json_name or name] for name, field in self.spec.fields.items()],
                    "required": sorted(self.spec.required)}
        digest = hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()
        return {"format": self.name, "fields_sha256": digest}
