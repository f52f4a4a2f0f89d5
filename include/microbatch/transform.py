"""The contract between the platform and a pipeline's Spark job.

A job is an object with four pure methods. The platform reads exactly the batch's ranges and calls `parse` with
a DataFrame of the Kafka records (`RECORD_COLUMNS`, and `HEADERS_COLUMN` when the spec sets
`source.include_headers`), followed by the typed columns that the spec's `source.key` and `source.value` formats
decode in the same pass (`formats/record.py`: a json value's fields under their names, `key_text`, `key_<field>`,
`value_text`). A record whose key or value its format cannot read never reaches `parse`: it is a dead letter with
the format's reason. Neither do tombstones (a key, a null value) when an upsert sink is keyed by the record key:
the platform stages them as deletes of their keys. It observes metrics and per-partition counts in the same pass
(no second read of Kafka), sends rows whose `error` is set to the dead-letter table (with the record's Kafka
`key`, `timestamp` and, with `include_headers`, `headers`, which the platform takes from the read: `parse` need
not keep them), rows flagged `late` (their event-time window was final before the batch began) to the
late-records table (with their headers too), and stages `outputs` of the rest.
Everything depends only on the records, the options and the state at the batch's start,
so a replay gives the same result (invariant 4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestamp_type")
"""The records `parse` is given, one row per Kafka record: `key` and `value` (binary, null when the producer sent
none), `topic` (string), `partition` (int), `offset` (bigint), `timestamp` (the record's Kafka timestamp) and
`timestamp_type` (int: 0 CreateTime, set by the producer; 1 LogAppendTime, set by the broker). With
`source.include_headers: true` in the spec, `HEADERS_COLUMN` follows them."""
HEADERS_COLUMN = "headers"
"""The record's headers, in the order the producer sent them: array<struct<key: string, value: binary>> (a value
may be null; a key may repeat). Only with `source.include_headers: true`."""
SOURCE_COLUMNS = ("topic", "partition", "offset", "value")
"""The columns of the records that `parse` keeps in its output."""
ERROR_COLUMN = "error"
LATE_COLUMN = "late"
EVENT_TIME_COLUMN = "event_time"


class SparkJob(Protocol):
    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
        """Keep SOURCE_COLUMNS; add parsed columns, `error` (null when the record is good), `late`
        (true for a good record whose window was final at the batch's start) and `event_time`."""

    def state_metrics(self, options: Mapping[str, Any]) -> dict[str, Column]:
        """Aggregate expressions over the parsed rows, observed during the read."""

    def next_state(
        self, state: Mapping[str, Any], metrics: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The pipeline state after this batch, from the state before and the observed metrics."""

    def outputs(
        self, parsed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]
    ) -> dict[str, DataFrame]:
        """Sink name -> the rows to stage for it: that sink's columns plus the source `topic` and
        `partition` (group by them too; a row sink also keeps `offset`). `parsed` holds only good, on-time
        rows, except in the second call the stage makes when a row sink has `include_late`: then it holds
        every valid row, its `late` column set, and only that sink's output of it is staged. The platform
        keeps each partition's partial aggregate, so a replay of one partition retracts exactly its part."""


def batch_constant(df: DataFrame, value: int) -> Column:
    """`value`, an integer that changes from batch to batch (a watermark from the state), as a bigint Column that
    Spark reads at run time.

    `F.lit(value)` would be compiled into Spark's generated code for the records, so each batch with a new value
    compiled that code anew and ran it cold until the JIT warmed it again: 0.22 s more per batch of 1M records,
    and 0.16 µs more executor CPU per record (`bench/stage_profile.py --pairs`, runs cw and cw0). Held in an array
    in a one-row VALUES subquery, the value reaches the generated code as a reference, so that code is the same
    in every batch and Spark reuses it."""
    return df.sparkSession.sql(f"SELECT * FROM VALUES (array(CAST({int(value)} AS BIGINT))) AS t(v)").scalar()[0]
