"""Which class implements each `format` of a spec, and the spec's union of the format models.

A new format is a module `formats/<name>.py` with its `FormatSpec` and `Format` subclass, added to `FORMATS`;
`FormatSpecs` and `format_for` follow from it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from microbatch.formats.avro import AvroFormat, AvroSpec
from microbatch.formats.base import Format, FormatSpec
from microbatch.formats.debezium import DebeziumFormat, DebeziumSpec
from microbatch.formats.debezium_avro import DebeziumAvroFormat
from microbatch.formats.json import JsonFormat, JsonSpec
from microbatch.formats.raw import RawFormat, RawSpec
from microbatch.formats.text import TextFormat, TextSpec

FORMATS: dict[str, type[Format[Any]]] = {cls.name: cls for cls in (RawFormat, TextFormat, JsonFormat, AvroFormat,
                                                                         DebeziumFormat)}


def _short_form(data: Any) -> Any:
    """`value: text` is `value: {format: text}`; an unknown or missing format is refused in one sentence."""
    spec = {"format": data} if isinstance(data, str) else data
    if isinstance(spec, dict) and spec.get("format") not in FORMATS:
        named = f"'{spec['format']}' is not a format" if "format" in spec else "is missing"
        raise ValueError(f"format: {named}; use one of {', '.join(FORMATS)}, e.g. `{{format: json, fields: "
                         "{payment_id: string}}`")
    return spec


FormatSpecs = Annotated[
    Annotated[RawSpec | TextSpec | JsonSpec | AvroSpec | DebeziumSpec, Field(discriminator="format")],
    BeforeValidator(_short_form)]
"""The type of `source.key` and `source.value`: `{format: raw}` (or `raw`), `{format: text}` (or `text`),
`{format: json, fields: {...}, required: [...]}`, `{format: avro, fields: {...}, subject: ..., version: latest}`,
`{format: debezium, fields: {...}, converter: json}`."""


def format_for(spec: FormatSpec) -> Format[Any]:
    """The format that reads the bytes as `spec` says (Debezium's Avro converter: `DebeziumAvroFormat`)."""
    if isinstance(spec, DebeziumSpec) and spec.converter == "avro":
        return DebeziumAvroFormat(spec)
    return FORMATS[spec.format](spec)
