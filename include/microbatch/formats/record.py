"""A record's key and value, each decoded by its format, as the columns a job gets beside the record columns.

Naming: a value's declared fields keep their names as top-level columns (`payment_id`, `amount_cents`), since
they are what a job works with; a key's columns are prefixed `key_` (`key_payment_id`), and a format that names
its one column itself is prefixed by its side (text: `value_text`, `key_text`). The binary `key` and `value`
stay as read, so a dead letter keeps the bytes the producer sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

from microbatch.formats import jvm
from microbatch.formats.base import Format, JavaFunction

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def column_name(side: str, fmt: Format[Any], name: str) -> str:
    """The job's name of the column `name` that `fmt` decodes from the record's `side` ("key" or "value")."""
    return name if side == "value" and fmt.declares_names else f"{side}_{name}"


def decoded_columns(key: Format[Any], value: Format[Any]) -> dict[str, str]:
    """The typed columns a job gets beside the record columns: name -> Spark SQL type, the key's first.
    ValueError with one sentence when two of them share a name (Spark's names ignore case)."""
    columns: dict[str, str] = {}
    for side, fmt in (("key", key), ("value", value)):
        for name, kind in fmt.side_columns(side).items():
            column = column_name(side, fmt, name)
            clash = next((known for known in columns if known.lower() == column.lower()), None)
            if clash is not None:
                raise ValueError(f"value.fields: '{name}' would be the column '{column}', which the key's format "
                                 f"already gives; rename it and read the JSON field with `from`")
            columns[column] = kind
    return columns


@dataclass(frozen=True)
class DecodedRecord:
    """`columns`: name -> the expression of each of `decoded_columns`; `reason`: null for a record whose key
    and value both decode, else the reasons of both, joined by '; '; `helpers` and `sql_conf`: both formats'
    (`Decoded`), which `select_decoded` applies."""

    columns: dict[str, Column]
    reason: Column
    helpers: tuple[dict[str, Column], ...] = ()
    sql_conf: dict[str, str] = field(default_factory=dict)
    functions: dict[str, JavaFunction] = field(default_factory=dict)


def decode_record(key: Format[Any], value: Format[Any], key_data: Column, value_data: Column) -> DecodedRecord:
    """The decode of a record's binary `key_data` and `value_data` (the record columns `key` and `value`)."""
    from pyspark.sql import functions as F

    decoded_columns(key, value)  # refuses a clash before Spark reports an ambiguous column
    columns: dict[str, Column] = {}
    decodes = [fmt.decode(data, side) for side, fmt, data in (("key", key, key_data), ("value", value, value_data))]
    for side, fmt, decoded in zip(("key", "value"), (key, value), decodes, strict=True):
        columns.update({column_name(side, fmt, name): column for name, column in decoded.columns.items()})
    reasons = [decoded.reason for decoded in decodes]
    paired = value.key_problem(key, decodes[0].columns, decodes[1].columns, value_data)
    if paired is not None:  # a value the format cannot read has its own reason
        reasons.append(F.when(decodes[1].reason.isNull(), paired))
    helpers = tuple({name: column for layer in layers for name, column in layer.items()}
                    for layers in zip_longest(*(decoded.helpers for decoded in decodes), fillvalue={}))
    # not nullif: Spark evaluates its argument in a Project of its own, which would decode the record twice
    return DecodedRecord(columns=columns, reason=F.when(F.coalesce(*reasons).isNotNull(), F.concat_ws("; ", *reasons)),
                         helpers=helpers, sql_conf={k: v for decoded in decodes for k, v in decoded.sql_conf.items()},
                         functions={k: v for decoded in decodes for k, v in decoded.functions.items()})


def select_decoded(records: DataFrame, decoded: DecodedRecord, reason: Column, reason_name: str) -> DataFrame:
    """`records` and after them the decoded columns and `reason` (the decode's, or one built on it) named
    `reason_name`. Sets the session's SQL settings the decode relies on (`decoded.sql_conf`, read when Spark plans
    the query) and registers its Java functions, then adds each layer of helpers with a select of its own and drops
    them at the end."""
    for key, setting in decoded.sql_conf.items():
        records.sparkSession.conf.set(key, setting)
    jvm.register(records.sparkSession, decoded.functions)
    with_helpers = records
    for layer in decoded.helpers:
        with_helpers = with_helpers.select("*", *[column.alias(name) for name, column in layer.items()])
    helper_names = [name for layer in decoded.helpers for name in layer]
    return with_helpers.select("*", *[column.alias(name) for name, column in decoded.columns.items()],
                               reason.alias(reason_name)).drop(*helper_names)


def record_key_columns(key: Format[Any]) -> dict[str, str]:
    """The columns that stand for the record key, name -> Spark SQL type: the decoded key's (`key_text`,
    `key_<field>`), or the `key` bytes themselves for a `raw` key. An upsert sink with `keys_from: record_key` is
    keyed by them."""
    return ({column_name("key", key, name): kind for name, kind in key.side_columns("key").items()}
            or {"key": "binary"})
