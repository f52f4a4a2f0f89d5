"""The one interface of a format: how the bytes of a record's key or value become typed columns.

A format is a module `formats/<name>.py` with a spec model (`FormatSpec` with `format: Literal["<name>"]`) and a
`Format` subclass that reads it. `decode` is a pure Spark column expression over the binary column, so the
decode runs in the same pass as the Kafka read, identically on classic Spark and Spark Connect (no Python UDF, no
RDD, no Python loop over rows). A format may also have a JVM decode (`on_jvm`): a Java function of the jar
`runtime.formats_jar()` builds from include/jvm, used where the stage's Spark has that jar (`formats/jvm.py`), and
equal to its built-in decode. `pins` says what a replay must hold fixed to decode the same bytes the same way.
`looks_like` and `infer` answer `microbatch new --from-topic`: whether a sample of a topic is this format, and
the side's spec and columns it gives (`formats/inference.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from pyspark.sql import Column

    from microbatch.formats.inference import Sample, SampledSide


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
    functions: dict[str, JavaFunction] = field(default_factory=dict)
    """The Java functions the expressions call by name, which `formats.record.select_decoded` registers."""


@dataclass(frozen=True)
class JavaFunction:
    """A Java class of the formats jar (a `UDF<n>`), registered under a name with the Spark SQL type it returns."""

    class_name: str
    returns: str


@dataclass(frozen=True)
class RegistrySchemas:
    """The schemas a batch decodes one side with, for a format that reads a schema registry: the reader (`version`
    of `subject`, registry id `reader_id`, its text `reader`) and the writer schemas' texts by registry id."""

    subject: str
    version: int
    reader_id: int
    reader: str
    writers: Mapping[int, str] = field(default_factory=dict)

    def pins(self) -> dict[str, Any]:
        """What the batch row keeps of them (the texts are kept once, by id, in `registry_schemas`)."""
        return {"subject": self.subject, "version": self.version, "reader_id": self.reader_id}


class Format(ABC, Generic[SpecT]):
    """A format of a record's key or value, made from its spec."""

    name: ClassVar[str]
    """The spec's `format` tag."""
    spec_model: ClassVar[type[FormatSpec]]
    uses_registry: ClassVar[bool] = False
    """True when the format reads its schemas from a schema registry (`avro`): the plan pins them in the batch and
    the stage decodes with the format `bound` to them."""
    declares_names: ClassVar[bool] = False
    """True when the spec names the columns (a json format's fields), so a value's columns keep those names;
    false when the format names its one column itself (text's `text`, seen as `value_text`/`key_text`)."""
    change_stream: ClassVar[bool] = False
    """True when a value is a change of a keyed row (debezium): `new --from-topic` reads the key with this format
    too (`Sample.change_stream`) and writes the upsert sink the value's `SampledSide.upsert` names."""
    stopping_reasons: ClassVar[tuple[str, ...]] = ()
    """Openings of the reasons of a record that stops its batch instead of being a dead letter: a change the platform
    does not apply, past which the sinks would be wrong (Debezium's truncate). The stage refuses the batch, naming
    the record and what to do."""
    guess_rank: ClassVar[int]
    """The order `new --from-topic` asks the formats whether a sample `looks_like` them, lowest first: the most
    particular first, raw (any bytes) last."""

    def __init__(self, spec: SpecT) -> None:
        self.spec = spec

    @abstractmethod
    def columns(self) -> dict[str, str]:
        """The columns the job gets from this format: name -> Spark SQL type (`{}`: the bytes stay as they are)."""

    def side_columns(self, side: str) -> dict[str, str]:
        """The columns of `side` ("key" or "value"): `columns()` unless the format reads its sides differently (a
        Debezium value has its change's columns beside the row's, its key the primary key's alone)."""
        return self.columns()

    def key_problem(self, key: Format[Any], key_columns: Mapping[str, Column], columns: Mapping[str, Column],
                    value_data: Column) -> Column | None:
        """A value format's check of the record key against its value (the decoded columns of both, by the format's
        names): a reason where they disagree, else null; None when the format has no such check."""
        return None

    @abstractmethod
    def decode(self, data: Column, subject: str) -> Decoded:
        """The decode of `data`, a binary column, as column expressions; `subject` ("key" or "value") opens each
        reason."""

    @classmethod
    def looks_like(cls, sample: Sample) -> bool:
        """Whether the sample has a non-null value and every non-null one reads as this format."""
        return False

    @classmethod
    def infer(cls, sample: Sample) -> SampledSide:
        """The side's spec and columns a sample that `looks_like` this format gives; the decoded columns it names
        are added to `sample.records`."""
        raise NotImplementedError(f"the {cls.name} format infers nothing from a sample")

    def subject(self, side: str, topics: list[str]) -> str | None:
        """A registry format: the registry subject of `side` ("key" or "value") for a source of `topics`; None when
        it cannot be told."""
        return None

    def reader_problem(self, reader: str, side: str, subject: str, version: int) -> str | None:
        """A registry format: why its declared fields cannot be read from the reader schema `reader` (one
        sentence naming the field, starting with `side`), or None."""
        return None

    def bound(self, schemas: RegistrySchemas) -> Format[SpecT]:
        """A registry format bound to a batch's schemas, which its `decode` needs; any other format as it is."""
        return self

    def on_jvm(self) -> Format[SpecT]:
        """This format decoding with its Java function (same columns and reasons, one pass over the bytes), for a
        Spark whose class path has the formats jar; itself when it has none or its spec is not one it takes."""
        return self

    def metrics(self, data: Column, side: str) -> dict[str, Column]:
        """Aggregates over the read that `pins` reports from (a registry format: which writer schemas it met)."""
        return {}

    def pins(self, metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What a replay must pin to reproduce the decode: the format, and whatever else it reads the bytes by
        (the declared fields' hash; for a registry format, the schema ids, the writers' from `metrics`, the values
        of `metrics()`)."""
        return {"format": self.name}
