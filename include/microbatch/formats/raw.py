"""`raw`: the bytes as they are, in the record's `key` or `value` column (the default; no record is ever bad)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from microbatch.formats.base import Decoded, Format, FormatSpec

if TYPE_CHECKING:
    from pyspark.sql import Column


class RawSpec(FormatSpec):
    """`{format: raw}`: the job decodes the bytes itself."""

    format: Literal["raw"] = "raw"


class RawFormat(Format[RawSpec]):
    name = "raw"
    spec_model = RawSpec

    def columns(self) -> dict[str, str]:
        return {}

    def decode(self, data: Column, subject: str) -> Decoded:
        from pyspark.sql import functions as F

        return Decoded(columns={}, reason=F.lit(None).cast("string"))
