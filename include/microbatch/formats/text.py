"""`text`: the bytes as UTF-8 text in one string column, `text` (the job sees `value_text` or `key_text`).

Bytes that are not valid UTF-8 make the record bad ("value is not valid UTF-8") rather than a string with
replacement characters, which would silently differ from what the producer sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from microbatch.formats.base import Decoded, Format, FormatSpec

if TYPE_CHECKING:
    from pyspark.sql import Column

TEXT_COLUMN = "text"


class TextSpec(FormatSpec):
    """`{format: text}`: UTF-8 text into one string column."""

    format: Literal["text"] = "text"


class TextFormat(Format[TextSpec]):
    name = "text"
    spec_model = TextSpec

    def columns(self) -> dict[str, str]:
        return {TEXT_COLUMN: "string"}

    def decode(self, data: Column, subject: str) -> Decoded:
        from pyspark.sql import functions as F

        valid = F.is_valid_utf8(data)
        return Decoded(columns={TEXT_COLUMN: F.when(valid, data.cast("string"))},
                       reason=F.when(data.isNotNull() & ~valid, F.lit(f"{subject} is not valid UTF-8")))
