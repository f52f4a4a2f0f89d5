"""What the sink models share: the column types and checks, the `SinkModel` base and the record-key keying."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal

from microbatch.column_types import (
    POSTGRES_FOR_SPARK,
    TIME_TYPES,
    ColumnType,  # noqa: F401  (re-exported: its old home)
)
from microbatch.config.primitives import _check_identifier, _Strict
from microbatch.config.source import SourceSpec
from microbatch.formats.record import record_key_columns

SOURCE_COORDINATES = ("topic", "partition", "offset")
"""Columns the platform adds to row sinks: where each row came from. A spec may not declare them."""
KEYS_FROM = Literal["columns", "record_key"]
"""Where an upsert sink's keys come from: the `keys` it lists (columns of the job's output), or the record key
(`record_key`: the decoded key's columns, `formats.record.record_key_columns`), with a tombstone (a record whose
value is null) as the delete of its key."""


@dataclass(frozen=True)
class OutputTopic:
    """A topic a sink publishes to, on the cluster of its Kafka `connection`; None: the broker's default."""

    connection: str
    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    config: dict[str, str] = dataclass_field(default_factory=dict)


class SinkModel(_Strict):
    """What every sink spec model answers, so that a check across sinks never asks a sink's type."""

    name: str
    sql: str | None = None
    """A Spark SQL query over the view `records` (the record columns and the decoded ones) that gives this sink's
    rows, instead of a Python job: e.g. `SELECT payment_id, amount_cents FROM records WHERE status = 'captured'`.
    The platform adds the source coordinates (row sinks) or the per-partition grouping (aggregates) itself."""

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        """What a query of this sink returns: one row per record (`rows`), per-partition partial sums
        (`partials`), or None: this sink takes no query."""
        return None

    @property
    def query_columns(self) -> list[str]:
        """The columns this sink's query must return."""
        return []

    @property
    def published_columns(self) -> list[str] | None:
        """The columns of the rows a kafka sink may publish from this sink (its key is one of them); None: this
        sink's rows cannot be published."""
        return None

    def check_among(self, sinks: Mapping[str, SinkModel]) -> None:
        """Raise `ValueError` (one sentence naming the field) if this sink does not fit the pipeline's other
        `sinks` (by name)."""
        return None

    @property
    def output_topic(self) -> OutputTopic | None:
        """The Kafka topic this sink publishes to, as `microbatch migrate` creates it; None: it publishes nothing."""
        return None

    @property
    def keyed_by_record(self) -> bool:
        """An upsert keyed by the record key (`keys_from: record_key`): its tombstones are deletes of their keys."""
        return getattr(self, "keys_from", "columns") == "record_key"

    @property
    def keeps_tombstones(self) -> bool:
        """An append sink that keeps each tombstone as a row (`keep_tombstones`)."""
        return bool(getattr(self, "keep_tombstones", False))


def _check_columns(columns: dict[str, str]) -> dict[str, str]:
    for name in columns:
        _check_identifier(name)
    return columns


def _check_row_columns(columns: dict[str, str]) -> dict[str, str]:
    """The columns of a sink whose rows carry their source coordinates: it may not declare those itself."""
    reserved = sorted(set(columns) & set(SOURCE_COORDINATES))
    if reserved:
        raise ValueError(f"declares {', '.join(reserved)}, which the platform adds itself; remove or rename it")
    return _check_columns(columns)


def _check_keys_given(keys_from: str, keys: list[str]) -> None:
    if keys_from == "columns" and not keys:
        raise ValueError("keys: list the key columns, or set keys_from: record_key to key the table by the record key")


def _keyed_by_record(sink: Any, source: SourceSpec) -> Any:
    """`sink` (an upsert sink with `keys_from: record_key`) with its `keys` set to the record key's columns, which
    it must declare; ValueError with one sentence naming the field otherwise."""
    key_columns = record_key_columns(source.key_format)
    where = f"sinks: upsert sink '{sink.name}'"
    if sink.keys and list(sink.keys) != list(key_columns):
        raise ValueError(f"{where} takes its keys from the record key ({', '.join(key_columns)}); remove its keys")
    missing = [name for name in key_columns if name not in sink.columns]
    if missing:
        example = ", ".join(f"{name}: {POSTGRES_FOR_SPARK.get(key_columns[name], 'text')}" for name in missing)
        raise ValueError(f"{where} is keyed by the record key's column(s) {', '.join(missing)} "
                         f"({_record_key_origin(source)}); declare them in its columns, e.g. `{example}`, and keep "
                         "them in its rows (its sql or the job selects them from the records)")
    known = {*sink.columns, *SOURCE_COORDINATES}
    _check_upsert_columns(list(key_columns), sink.order_by, sink.delete_column, sink.columns, known=known)
    if sink.order_by is not None and sink.columns.get(sink.order_by) not in TIME_TYPES:
        raise ValueError(f"{where}: order_by '{sink.order_by}' must be a timestamptz or timestamp column (the record "
                         "`timestamp` or a decoded time), since a tombstone takes part in the order by its record "
                         "timestamp; or remove order_by to keep Kafka's order (the latest offset wins)")
    return sink.model_copy(update={"keys": list(key_columns)})


def _record_key_origin(source: SourceSpec) -> str:
    """Where the record key's columns come from, by `source.key`'s format, for the sentence of a sink lacking them."""
    fmt = source.key_format.name
    if fmt == "raw":
        return "the key's bytes, as no source.key format is set; `source.key: text` decodes it into key_text"
    if fmt == "text":
        return "the key decoded as UTF-8 by `source.key: text`"
    return f"the key's fields decoded by `source.key: {{format: {fmt}}}`, each key_<field>"


def _check_upsert_columns(keys: list[str], order_by: str | None, delete_column: str | None,
                          columns: dict[str, str], known: set[str]) -> None:
    """An upsert sink's keys and order column are among the `known` columns; its delete column is not stored."""
    for field_name, names in (("keys", keys), ("order_by", [order_by] if order_by else [])):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"{field_name}: {', '.join(unknown)} is not among the columns; declare it in columns")
    if delete_column is not None and delete_column in columns:
        raise ValueError(f"delete_column: '{delete_column}' marks deletes and is not stored; remove it from columns")
