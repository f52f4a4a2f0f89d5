"""The seeds' exactly-once IP count: requests per IP per tumbling event-time window.

Input lines are nginx access-log lines; only the client IP and the time are used:
    203.0.113.7 - - [22/Nov/2026:23:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8"
A line without both is a dead letter, and so is one whose client field is not an IPv4 or IPv6 address
exactly as Python's `ipaddress.ip_address` reads it (octets 0-255 without leading zeros; IPv6 with `::`,
an IPv4 suffix and an RFC 4007 `%scope`); tests/integration/test_ip_address_parse.py holds the two to
it. Output rows are partial counts of this batch, per source partition; the commit adds them to
`ip_counts`, so a window that spans batches stays exact.
An event time more than `max_event_time_ahead_seconds` (default one day) ahead of the record's
Kafka timestamp is a dead letter: one bad clock would otherwise push the watermark past every
later record. Option `exclude_ips` (a list) leaves those clients out of the counts: changing it and replaying a
range (backfill mode `replay`) recomputes that range's contribution only.

Event time follows Flink's model. The watermark is the maximum event time seen so far minus
`allowed_lateness_seconds`; it is pipeline state, committed with the ledger. A window whose
end is at or before the watermark is final. A record for a window that was already final
when its batch began is late: it goes to the late-records table, never into a window that
may already be published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.event_time import watermark_after, watermark_metrics, with_late

# The client field is the whole first field, so that `is_ip_address` alone decides what an address is.
LINE_PATTERN = r'^(\S+) \S+ \S+ \[([^\]]+)\] "'
TIME_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"
REASON_ADDRESS_CHARS = 100

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"  # 0-255 without leading zeros, as ipaddress (3.9.5+)
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_HEXTET = "[0-9A-Fa-f]{1,4}"


def _ipv6_pattern() -> str:
    """The IPv6 forms `ipaddress.IPv6Address` accepts: eight hextets, or six and an IPv4 suffix, or either with
    `::` standing for at least one zero hextet; then an optional RFC 4007 scope id (any, without '%')."""

    def hextets(n: int) -> str:
        return "" if n == 0 else rf"{_HEXTET}(?::{_HEXTET}){{{n - 1}}}"

    forms = [rf"(?:{_HEXTET}:){{7}}{_HEXTET}", rf"(?:{_HEXTET}:){{6}}{_IPV4}"]
    for before in range(8):  # `before` hextets, `::`, then at most 7 - before (5 - before and an IPv4 suffix)
        after = 7 - before
        forms.append(hextets(before) + "::" + (rf"(?:{_HEXTET}(?::{_HEXTET}){{0,{after - 1}}})?" if after else ""))
        if before <= 5:
            forms.append(hextets(before) + rf"::(?:{_HEXTET}:){{0,{5 - before}}}{_IPV4}")
    return r"\A(?:" + "|".join(forms) + r")(?:%[^%]+)?\z"


# `\A` and `\z`, not `^` and `$`: Java's `$` also matches before a final line break.
IPV4_PATTERN = rf"\A{_IPV4}\z"
IPV6_PATTERN = _ipv6_pattern()


def is_ip_address(address: Column) -> Column:
    """True where `address` is an IPv4 or IPv6 address exactly as `ipaddress.ip_address` reads it; Spark SQL
    only (no UDF). A colon picks the family, so an IPv4 address is matched by the short pattern alone."""
    return F.when(address.contains(":"), address.rlike(IPV6_PATTERN)).otherwise(address.rlike(IPV4_PATTERN))


def window_seconds(options: Mapping[str, Any]) -> int:
    return int(options.get("window_seconds", 5))


class IpCount:
    """Implements `microbatch.transform.SparkJob`."""

    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
        # One projection per step, each referring to the previous step's columns: Spark then evaluates each
        # regex and the time parse once per record. Written as one nested expression, the CASE WHEN of `error`
        # re-evaluated them per branch (bench/stage_profile.py: parse + aggregate 2.40 s -> 1.44 s per 1M).
        source = ["topic", "partition", "offset", "value", "timestamp"]
        fields = records.select(*source, F.col("value").cast("string").alias("_line")).select(
            *source,
            F.regexp_extract("_line", LINE_PATTERN, 1).alias("ip"),
            F.regexp_extract("_line", LINE_PATTERN, 2).alias("_time"),
        )
        typed = fields.select(*source, "ip", F.try_to_timestamp("_time", F.lit(TIME_FORMAT)).alias("event_time"))
        ip, event_time = F.col("ip"), F.col("event_time")
        error = (
            F.when(F.col("value").isNull(), F.lit("empty record"))
            .when(ip == "", F.lit("not an access-log line: no client IP and [time] found"))
            .when(~is_ip_address(ip), F.concat(
                F.lit("client address '"),
                F.when(F.length(ip) <= REASON_ADDRESS_CHARS, ip)
                .otherwise(F.concat(F.substring(ip, 1, REASON_ADDRESS_CHARS), F.lit("..."))),
                F.lit("' is not a valid IPv4 or IPv6 address")))
            .when(event_time.isNull(), F.lit("the [time] field is not dd/MMM/yyyy:HH:mm:ss Z"))
        )
        # A clock far ahead would move the watermark past every later record: refuse event times too far
        # ahead of the record's own Kafka timestamp (deterministic: both are fixed in the record).
        ahead = int(options.get("max_event_time_ahead_seconds", 86_400))
        too_far_ahead = F.unix_seconds(event_time) > F.unix_seconds(F.col("timestamp")) + ahead
        error = error.when(too_far_ahead, F.lit(
            f"the [time] field is more than {ahead} s ahead of the record's Kafka timestamp"))
        checked = typed.select("topic", "partition", "offset", "value", "ip", "event_time", error.alias("error"))
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
        excluded = [str(ip) for ip in options.get("exclude_ips", [])]
        if excluded:
            parsed = parsed.where(~F.col("ip").isin(excluded))
        start_s = F.floor(F.unix_seconds("event_time") / width) * width
        windowed = parsed.select(
            "topic", "partition",
            F.timestamp_seconds(start_s).alias("window_start"),
            F.timestamp_seconds(start_s + width).alias("window_end"),
            "ip",
        )
        counts = windowed.groupBy("topic", "partition", "window_start", "window_end", "ip").agg(
            F.count(F.lit(1)).alias("count"))
        return {"ip_counts": counts}


transform = IpCount()
