"""`raw`: the bytes as they are, in the record's `key` or `value` column (the default; no record is ever bad)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from microbatch.formats.base import Decoded, Format, FormatSpec

if TYPE_CHECKING:
    from pyspark.sql import Column

    from microbatch.formats.inference import Sample, SampledSide


class RawSpec(FormatSpec):
    """`{format: raw}`: the job decodes the bytes itself."""

    format: Literal["raw"] = "raw"


class RawFormat(Format[RawSpec]):
    name = "raw"
    spec_model = RawSpec
    guess_rank = 3

    def columns(self) -> dict[str, str]:
        return {}

    def decode(self, data: Column, subject: str) -> Decoded:
        from pyspark.sql import functions as F

        return Decoded(columns={}, reason=F.lit(None).cast("string"))

    @classmethod
    def looks_like(cls, sample: Sample) -> bool:
        """Any sample is raw (asked last), one whose every value is null too."""
        return True

    @classmethod
    def infer(cls, sample: Sample) -> SampledSide:
        """No column for a side that is always null, else the bytes as they are."""
        from microbatch.formats.inference import SampledSide

        if not sample.present:
            return SampledSide(cls.name, None, (), f"none (every sampled {sample.side} is null)")
        return cls.kept(sample, f"raw: not all UTF-8, kept as bytes in {sample.side}")

    @classmethod
    def kept(cls, sample: Sample, summary: str) -> SampledSide:
        """The side's bytes kept as they are, in its record column (`key` or `value`)."""
        from microbatch.formats.inference import SampledColumn, SampledSide

        side = sample.side
        return SampledSide(cls.name, None, (SampledColumn(side, "binary", side, f"{side} (bytes)"),), summary)
