"""Event time as Flink models it, for SQL pipelines and Python jobs alike: tumbling windows, and a watermark that
is pipeline state, committed with the ledger (the maximum event time seen minus `allowed_lateness_seconds`, default
5; the spec's `event_time` section sets both). A window whose end is at or before the watermark is final; a valid
record whose window was final when its batch began is late."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from microbatch.transform import batch_constant

MICROS = 1_000_000
PLANNED_OPTION = "batch_planned_us"
"""The job option the stage sets to the batch's planned time: the clock of a record without its Kafka timestamp."""
MAX_FUTURE_OPTION = "max_future_seconds"
DEFAULT_MAX_FUTURE_SECONDS = 86_400
LAST_TIME_US = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z: the last time Python, Postgres and the ledger's state can hold."""


def lateness_us(options: Mapping[str, Any]) -> int:
    return int(float(options.get("allowed_lateness_seconds", 5)) * MICROS)


def watermark_after(state: Mapping[str, Any], batch_max_event_us: int | None, options: Mapping[str, Any]) -> dict:
    """The state after a batch: the max event time seen and the watermark, which never goes back."""
    seen = [v for v in (state.get("max_event_time_us"), batch_max_event_us) if v is not None]
    if not seen:
        return dict(state)
    max_event = max(seen)
    watermark = max_event - lateness_us(options)
    if state.get("watermark_us") is not None:
        watermark = max(watermark, state["watermark_us"])
    return {**state, "max_event_time_us": max_event, "watermark_us": watermark}


def guard_future(checked: DataFrame, options: Mapping[str, Any]) -> DataFrame:
    """`checked` with an `error` for a record whose event time is further ahead than `max_future_seconds` (default a
    day) of a clock every replay sees the same way, its Kafka `timestamp` when `checked` has it, else the batch's
    planned time; or past year 9999. Such a record would move the watermark so far that every later one is late:
    it is a dead letter instead, and moves nothing."""
    limit = int(float(options.get(MAX_FUTURE_OPTION, DEFAULT_MAX_FUTURE_SECONDS)) * MICROS)
    event = F.unix_micros("event_time")
    if "timestamp" in checked.columns:
        clock, name = F.unix_micros("timestamp"), "its Kafka timestamp"
    elif options.get(PLANNED_OPTION) is not None:
        clock, name = F.lit(int(options[PLANNED_OPTION])), "its batch's planned time"
    else:
        clock, name = None, ""
    reason = F.when(event > F.lit(LAST_TIME_US), F.lit("the event time is past year 9999, which no watermark holds"))
    if clock is not None:
        reason = reason.when(event > clock + F.lit(limit), F.lit(
            f"the event time is more than {_duration_text(limit // MICROS)} ahead of {name} (max_future); it would "
            "move the watermark past every later record"))
    return checked.withColumn("error", F.coalesce(F.col("error"), reason))


def _duration_text(seconds: int) -> str:
    for unit, size in (("day", 86_400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


def with_late(checked: DataFrame, width_seconds: int | None, state: Mapping[str, Any],
              options: Mapping[str, Any] | None = None) -> DataFrame:
    """`checked` (with `event_time` and `error`) and a `late` column: a valid record whose `width_seconds` window
    ended at or before the watermark its batch began with (without a window: whose event time is at or before it).
    With the job's `options`, a record too far in the future is refused first (`guard_future`)."""
    if options is not None:
        checked = guard_future(checked, options)
    if width_seconds:
        window_end_us = (F.floor(F.unix_seconds("event_time") / width_seconds) * width_seconds + width_seconds) * MICROS
    else:
        window_end_us = F.unix_micros("event_time")
    watermark = state.get("watermark_us")
    late = F.lit(False) if watermark is None else F.coalesce(window_end_us <= batch_constant(checked, watermark),
                                                             F.lit(False))
    return checked.select("*", (F.col("error").isNull() & late).alias("late"))


def watermark_metrics() -> dict[str, Column]:
    """A job's `state_metrics` when its state is the watermark: the max event time of the batch's valid,
    on-time records (its `next_state` is then `watermark_after(state, metrics["max_event_time"], options)`)."""
    good = F.col("error").isNull() & ~F.col("late")
    return {"max_event_time": F.max(F.when(good, F.unix_micros("event_time")))}


def check_event_time_column(parsed: DataFrame, pipeline: str) -> None:
    """Refuse (one `SpecError` sentence, before the stage writes anything) a job whose `event_time` column is not a
    timestamp: a number there would be read as seconds, and epoch milliseconds put the watermark in year 57876."""
    from microbatch.errors import SpecError
    from microbatch.transform import EVENT_TIME_COLUMN

    field = next((f for f in parsed.schema.fields if f.name == EVENT_TIME_COLUMN), None)
    kind = None if field is None else field.dataType.simpleString()
    if kind is not None and kind not in ("timestamp", "timestamp_ntz", "void"):
        raise SpecError(
            f"{pipeline}: the job's {EVENT_TIME_COLUMN} column is {kind}, not a timestamp; nothing was written.",
            fix="Return a timestamp: for epoch milliseconds F.timestamp_millis(col), for seconds "
                "F.timestamp_seconds(col), for a string F.to_timestamp(col, pattern).")


def check_state_times(state: Mapping[str, Any], pipeline: str) -> None:
    """Refuse (one `SpecError` sentence, before the stage reads or writes anything) a batch whose starting state holds
    a time no table can hold (past year 9999): a watermark an older release let run away."""
    from microbatch.errors import SpecError

    for key in ("watermark_us", "max_event_time_us"):
        value = state.get(key)
        if value is not None and not -LAST_TIME_US <= int(value) <= LAST_TIME_US:
            raise SpecError(
                f"{pipeline}: the pipeline's {key.removesuffix('_us')} ({value} µs since 1970) is past year 9999, "
                "which no table can hold; nothing was written.",
                fix=f"Abandon the open batch (`microbatch history {pipeline}` names it), then `microbatch reset "
                    f"{pipeline} --watermark clear`; `microbatch state {pipeline}` shows the state.")

