"""The seeds' exactly-once IP count: requests per IP per tumbling event-time window.

Input lines are nginx access-log lines; only the client IP and the time are used:
    203.0.113.7 - - [22/Nov/2026:23:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8"
A line without both is a dead letter. Output rows are partial counts of this batch;
the commit adds them to `ip_counts`, so a window that spans batches stays exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

LINE_PATTERN = r'^([0-9A-Fa-f.:]{3,45}) \S+ \S+ \[([^\]]+)\] "'
IP_PATTERN = r"^(\d{1,3}\.){3}\d{1,3}$|^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$"
TIME_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"


class IpCount:
    """Implements `microbatch.transform.SparkJob`."""

    def parse(self, records: DataFrame, options: Mapping[str, Any]) -> DataFrame:
        line = F.col("value").cast("string")
        ip = F.regexp_extract(line, LINE_PATTERN, 1)
        event_time = F.try_to_timestamp(F.regexp_extract(line, LINE_PATTERN, 2), F.lit(TIME_FORMAT))
        error = (
            F.when(F.col("value").isNull(), F.lit("empty record"))
            .when(ip == "", F.lit("not an access-log line: no client IP and [time] found"))
            .when(~ip.rlike(IP_PATTERN), F.lit("the client IP is not an IPv4 or IPv6 address"))
            .when(event_time.isNull(), F.lit("the [time] field is not dd/MMM/yyyy:HH:mm:ss Z"))
        )
        return records.select("topic", "partition", "offset", "value", ip.alias("ip"), event_time.alias("event_time"),
                              error.alias("error"))

    def state_metrics(self, options: Mapping[str, Any]) -> dict[str, Column]:
        return {"max_event_time": F.max(F.when(F.col("error").isNull(), F.unix_micros("event_time")))}

    def next_state(
        self, state: Mapping[str, Any], metrics: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        seen = [v for v in (state.get("max_event_time_us"), metrics.get("max_event_time")) if v is not None]
        return {**state, "max_event_time_us": max(seen) if seen else None}

    def outputs(
        self, parsed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]
    ) -> dict[str, DataFrame]:
        width = int(options.get("window_seconds", 5))
        start_s = F.floor(F.unix_seconds("event_time") / width) * width
        windowed = parsed.select(
            F.timestamp_seconds(start_s).alias("window_start"),
            F.timestamp_seconds(start_s + width).alias("window_end"),
            "ip",
        )
        counts = windowed.groupBy("window_start", "window_end", "ip").agg(F.count(F.lit(1)).alias("count"))
        return {"ip_counts": counts}


transform = IpCount()
