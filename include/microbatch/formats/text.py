"""`text`: the bytes as UTF-8 text in one string column, `text` (the job sees `value_text` or `key_text`).

Bytes that are not valid UTF-8 make the record bad ("value is not valid UTF-8") rather than a string with
replacement characters, which would silently differ from what the producer sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from microbatch.formats.base import Decoded, Format, FormatSpec

if TYPE_CHECKING:
    from pyspark.sql import Column

    from microbatch.formats.inference import Sample, SampledSide

TEXT_COLUMN = "text"


class TextSpec(FormatSpec):
    """`{format: text}`: UTF-8 text into one string column."""

    format: Literal["text"] = "text"


class TextFormat(Format[TextSpec]):
    name = "text"
    spec_model = TextSpec
    guess_rank = 2

    def columns(self) -> dict[str, str]:
        return {TEXT_COLUMN: "string"}

    def decode(self, data: Column, subject: str) -> Decoded:
        from pyspark.sql import functions as F

        valid = F.is_valid_utf8(data)
        return Decoded(columns={TEXT_COLUMN: F.when(valid, data.cast("string"))},
                       reason=F.when(data.isNotNull() & ~valid, F.lit(f"{subject} is not valid UTF-8")))

    @classmethod
    def looks_like(cls, sample: Sample) -> bool:
        """Every non-null value is UTF-8."""
        try:
            for data in sample.present:
                data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return bool(sample.present)

    @classmethod
    def infer(cls, sample: Sample) -> SampledSide:
        """One column of the text, `value_text` or `key_text`."""
        from microbatch.formats.inference import SampledColumn, SampledSide

        side = sample.side
        name = f"{side}_{TEXT_COLUMN}"
        sample.records.add(name)
        column = SampledColumn(name, "string", name, f"{side} (UTF-8 text)")
        return SampledSide(cls.name, {"format": cls.name}, (column,), f"text: UTF-8, not all JSON objects, into {name}")
