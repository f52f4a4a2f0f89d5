"""JSON click events, `{"user": "u1", "page": "/home", "ts": "2026-11-25T10:00:01Z"}`, into four outputs:

- `clicks_raw`: every valid click as one row (`user`, `page`, `ts`) with its source topic, partition and offset,
  for a `postgres_append` sink (with `include_late`, late clicks land there too);
- `page_views`: clicks per page per tumbling event-time window (`window_seconds`, default 60), partial
  counts per source partition, for a windowed `postgres_aggregate` sink;
- `user_last_page`: each click's `user`, `page`, `ts` and `forget` with its coordinates, for a
  `postgres_upsert` sink keyed by user, ordered by ts, with `delete_column: forget`;
- `clicks_lake`: the same rows as `clicks_raw`, for a `delta` (Delta Lake) append sink.

`{"user": "u1", "forget": true, "ts": ...}` (no page) asks to forget the user: a tombstone of its last page,
a row with no page in `clicks_raw`, and no page view. A record that is not a JSON object with string fields
`user`, `page` (unless `forget`) and an ISO-8601 `ts` (with a zone, e.g. `Z`) is a dead letter. Event time
follows ip_count: the watermark is the maximum event time seen minus `allowed_lateness_seconds` (default 5),
pipeline state; a click whose window was final when its batch began is late.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType, StructField, StructType

from spark_jobs.event_time import watermark_after, watermark_metrics, with_late

CLICK_SCHEMA = StructType([*(StructField(name, StringType()) for name in ("user", "page", "ts")),
                           StructField("forget", BooleanType())])
TS_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX"


def window_seconds(options: Mapping[str, Any]) -> int:
    return int(options.get("window_seconds", 60))


class Clicks:
    """Implements `microbatch.transform.SparkJob`."""

    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
        source = ["topic", "partition", "offset", "value"]
        fields = records.select(*source, F.from_json(F.col("value").cast("string"), CLICK_SCHEMA).alias("_c"))
        typed = fields.select(
            *source, F.col("_c.user").alias("user"), F.col("_c.page").alias("page"), F.col("_c.ts").alias("_ts"),
            F.try_to_timestamp(F.col("_c.ts"), F.lit(TS_FORMAT)).alias("event_time"),
            F.coalesce(F.col("_c.forget"), F.lit(False)).alias("forget"),
        )
        error = (
            F.when(F.col("value").isNull(), F.lit("empty record"))
            .when(F.col("user").isNull() | (F.col("page").isNull() & ~F.col("forget")) | F.col("_ts").isNull(),
                  F.lit("not a JSON click: needs the string fields user, page and ts"))
            .when(F.col("event_time").isNull(), F.lit("ts is not an ISO-8601 time with a zone, e.g. "
                                                      "2026-11-25T10:00:01Z"))
        )
        checked = typed.select(*source, "user", "page", "forget", "event_time", error.alias("error"))
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
        raw = parsed.select("user", "page", F.col("event_time").alias("ts"), "topic", "partition", "offset")
        start_s = F.floor(F.unix_seconds("event_time") / width) * width
        views = parsed.where(~F.col("forget")).select(
            "topic", "partition", "page",
            F.timestamp_seconds(start_s).alias("window_start"),
            F.timestamp_seconds(start_s + width).alias("window_end"),
        ).groupBy("topic", "partition", "window_start", "window_end", "page").agg(F.count(F.lit(1)).alias("views"))
        last_page = parsed.select("user", "page", F.col("event_time").alias("ts"), "forget", "topic", "partition",
                                  "offset")
        return {"clicks_raw": raw, "page_views": views, "user_last_page": last_page, "clicks_lake": raw}


transform = Clicks()
