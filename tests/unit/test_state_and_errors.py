"""Issue 60's pure parts: the watermark a reset makes of a pipeline's state, a time no datetime holds said in words,
the spark-submit exit code that is terminal, and a watermark past year 9999 as one sentence instead of a crash."""

from __future__ import annotations

import pytest

from microbatch.airflow.operators import TERMINAL_EXIT, driver_exit_code
from microbatch.errors import MicrobatchError, SpecError
from microbatch.event_time import LAST_TIME_US, _duration_text
from microbatch.phases.reset import time_text, watermark_state
from microbatch.sinks.base import watermark_timestamp

WEDGED = {"watermark_us": 1_764_000_000_000_000_000, "max_event_time_us": 1_764_000_000_005_000_000, "seen": 3}


def test_a_reset_clears_or_sets_the_watermark_and_keeps_the_jobs_values():
    assert watermark_state(WEDGED, "clear") == {"seen": 3}
    assert watermark_state(WEDGED, "2026-11-29T08:00:00Z") == {
        "seen": 3, "watermark_us": 1_795_939_200_000_000, "max_event_time_us": 1_795_939_200_000_000}
    with pytest.raises(SpecError, match="has no time zone"):
        watermark_state(WEDGED, "2026-11-29T08:00:00")
    with pytest.raises(SpecError, match="is not an ISO-8601 time"):
        watermark_state(WEDGED, "yesterday")


def test_times_past_year_9999_are_words_not_tracebacks():
    assert time_text(1_795_939_200_000_000) == "2026-11-29T08:00:00Z"
    assert time_text(LAST_TIME_US).startswith("9999-12-31T23:59:59.999999")
    assert "past year 9999" in time_text(WEDGED["watermark_us"])
    with pytest.raises(MicrobatchError) as refused:
        watermark_timestamp(WEDGED["watermark_us"])
    assert "past year 9999" in str(refused.value) and "--watermark clear" in str(refused.value)
    assert watermark_timestamp(None) is None


def test_the_terminal_exit_of_a_driver_is_read_from_the_providers_message():
    message = "Cannot execute: spark-submit --master local[2] ... Error code is: 2."
    assert driver_exit_code(message) == TERMINAL_EXIT
    assert driver_exit_code("Cannot execute: ... Error code is: 1.") == 1
    assert driver_exit_code("something else") is None


def test_durations_read_as_words():
    assert [_duration_text(s) for s in (86_400, 172_800, 3600, 90, 60)] == [
        "1 day", "2 days", "1 hour", "90 seconds", "1 minute"]


def test_a_starting_state_no_time_holds_is_refused_before_the_stage_writes():
    from microbatch.event_time import check_state_times

    check_state_times({"watermark_us": 1_795_939_200_000_000, "runs": 2}, "p")
    check_state_times({}, "p")
    with pytest.raises(SpecError) as refused:
        check_state_times(WEDGED, "p")
    assert str(refused.value).startswith("p: the pipeline's watermark (1764000000000000000 µs since 1970) is past "
                                         "year 9999, which no table can hold; nothing was written.")
    assert "microbatch reset p --watermark clear" in str(refused.value) and not refused.value.retryable
