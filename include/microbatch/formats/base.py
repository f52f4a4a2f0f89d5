"""The one interface of a format: how the bytes of a record's key or value become typed columns.

A format is a module `formats/<name>.py` with a spec model (`FormatSpec` with `format: Literal["<name>"]`) and a
`Format` subclass that reads it. `decode` is a pure Spark column expression over the binary column, so the
decode runs in the same pass as the Kafka read, identically on classic Spark and Spark Connect (no UDF, no RDD,
no Python loop over rows). `pins` says what a replay must hold fixed to decode the same bytes the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from pyspark.sql import Column


class FormatSpec(BaseModel):
    """`source.key` or `source.value` of a spec: the format's name in `format`, then its own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str


SpecT = TypeVar("SpecT", bound=FormatSpec)


@dataclass(frozen=True)
class Decoded:
    """The decode of one binary column: `columns` in the order and with the types of `Format.columns()`, and
    `reason`, a string that is null for a record the format reads, else names the column or field and what is
    wrong. A null input (a tombstone's value, a record without a key) decodes to nulls and is never bad.

    `helpers`: columns computed before `columns` and `reason`, one select a layer, in order (each layer may use the
    record's columns and the earlier layers' names; `formats.record.select_decoded` adds them, then drops them).
    A layer is a Project of its own, so what a later expression uses several times is computed once a record:
    Spark shares no subexpression inside a CASE branch. `sql_conf`: the session's SQL settings the decode relies
    on."""

    columns: dict[str, Column]
    reason: Column
    helpers: tuple[dict[str, Column], ...] = ()
    sql_conf: dict[str, str] = field(default_factory=dict)


class Format(ABC, Generic[SpecT]):
    """A format of a record's key or value, made from its spec."""

    name: ClassVar[str]
    """The spec's `format` tag."""
    spec_model: ClassVar[type[FormatSpec]]
    declares_names: ClassVar[bool] = False
    """True when the spec names the columns (a json format's fields), so a value's columns keep those names;
    false when the format names its one column itself (text's `text`, seen as `value_text`/`key_text`)."""

    def __init__(self, spec: SpecT) -> None:
        self.spec = spec

    @abstractmethod
    def columns(self) -> dict[str, str]:
        """The columns the job gets from this format: name -> Spark SQL type (`{}`: the bytes stay as they are)."""

    @abstractmethod
    def decode(self, data: Column, subject: str) -> Decoded:
        """The decode of `data`, a binary column, as column expressions; `subject` ("key" or "value") opens each
        reason."""

    def pins(self) -> dict[str, str]:
        """What a replay must pin to reproduce the decode: the format, and whatever else it reads the bytes by
        (the declared fields' hash; for a registry format, the schema ids)."""
        return {"format": self.name}
