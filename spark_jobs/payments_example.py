"""Payment events keyed by payment id, their JSON value decoded by the platform (`source.value: json`), into:

- `payments_latest`: each payment's latest event, for a `postgres_upsert` (or `delta` upsert) sink with
  `keys_from: record_key`: the platform keys it by the record key (`key_text`) and stages the topic's tombstones
  (a payment id with a null value) as deletes; the job never sees them;
- `payments_log`: every payment event with the `traceparent` header of its record, for a `postgres_append` sink
  (with `source.include_headers: true`; without it the column is null);
- `merchant_totals`: the amount per merchant per tumbling event-time window of `ts` (`window_seconds`,
  default 60), partial sums per source partition, for a windowed `postgres_aggregate` sink.

The job reads the typed columns the platform decoded (`payment_id`, `merchant`, `amount_cents`, `status`, `ts`);
a value that is not JSON, lacks a required field or has a field of another type never reaches it (a dead letter
with the platform's reason). Its own rule: a negative amount is a dead letter. Event time is `ts`, with the
watermark of `spark_jobs.event_time`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.event_time import watermark_after, watermark_metrics, with_late

FIELDS = ("payment_id", "merchant", "amount_cents", "status", "ts")


def window_seconds(options: Mapping[str, Any]) -> int:
    return int(options.get("window_seconds", 60))


def header(name: str) -> Column:
    """The first value of the record's header `name` as text (null when absent, or headers are not read)."""
    found = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
    return F.element_at(found, 1)["value"].cast("string")


class Payments:
    """Implements `microbatch.transform.SparkJob`."""

    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
        trace = header("traceparent") if "headers" in records.columns else F.lit(None).cast("string")
        error = F.when(F.col("amount_cents") < 0, F.lit("amount_cents is negative"))
        checked = records.select("topic", "partition", "offset", "value", "key_text", *FIELDS,
                                 trace.alias("traceparent"), F.col("ts").alias("event_time"), error.alias("error"))
        return with_late(checked, window_seconds(options), state, options)

    def state_metrics(self, options: Mapping[str, Any]) -> dict[str, Column]:
        return watermark_metrics()

    def next_state(
        self, state: Mapping[str, Any], metrics: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        return watermark_after(state, metrics.get("max_event_time"), options)

    def outputs(
        self, parsed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]
    ) -> dict[str, DataFrame]:
        width = window_seconds(options)
        coordinates = ("topic", "partition", "offset")
        latest = parsed.select("key_text", "merchant", "amount_cents", "status", "ts", *coordinates)
        log = parsed.select("payment_id", "amount_cents", "traceparent", *coordinates)
        start_s = F.floor(F.unix_seconds("ts") / width) * width
        totals = parsed.select(
            "topic", "partition", "merchant", "amount_cents",
            F.timestamp_seconds(start_s).alias("window_start"),
            F.timestamp_seconds(start_s + width).alias("window_end"),
        ).groupBy("topic", "partition", "window_start", "window_end", "merchant").agg(
            F.sum("amount_cents").alias("amount_cents"), F.count(F.lit(1)).alias("payments"))
        return {"payments_latest": latest, "payments_log": log, "merchant_totals": totals}


transform = Payments()
