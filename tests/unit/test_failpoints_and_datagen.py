"""Failpoint arming (crash and pause), the leader-move sentence, and the data generator's independent recount."""

import ipaddress
import time
from datetime import UTC, datetime, timedelta

from microbatch import failpoints
from microbatch.dev.datagen import INVALID_ADDRESSES, LogLine, expected_counts, format_line, generate_lines
from microbatch.kafka.offsets import leader_moves

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def test_failpoint_fires_once_with_marker_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(failpoints.FAILPOINTS_ENV, "commit.before_commit,stage.read=7")
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    assert failpoints.argument("stage.read") == "7"
    assert failpoints.argument("commit.before_commit") == ""
    assert failpoints.argument("stage.after_write") is None
    (tmp_path / "stage.read").touch()
    assert failpoints.argument("stage.read") is None


def test_failpoints_armed_by_file_while_running(tmp_path, monkeypatch):
    monkeypatch.delenv(failpoints.FAILPOINTS_ENV, raising=False)
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    assert failpoints.argument("publish.after_commit") is None
    (tmp_path / failpoints.ARMED_FILE).write_text("publish.after_commit=kill,stage.read=5")
    assert failpoints.argument("publish.after_commit") == "kill"
    assert failpoints.argument("stage.read") == "5"
    (tmp_path / failpoints.ARMED_FILE).write_text("")
    assert failpoints.argument("publish.after_commit") is None


def test_pause_failpoint_holds_once_and_marks(tmp_path, monkeypatch):
    monkeypatch.delenv(failpoints.FAILPOINTS_ENV, raising=False)
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    (tmp_path / failpoints.ARMED_FILE).write_text("plan.list_offsets=pause:0.2")
    started = time.monotonic()
    failpoints.hit("plan.list_offsets")  # holds, then goes on: the process does not die
    assert time.monotonic() - started >= 0.2
    assert (tmp_path / "plan.list_offsets").exists()
    started = time.monotonic()
    failpoints.hit("plan.list_offsets")  # fired once: the marker lets the next hit through at once
    assert time.monotonic() - started < 0.2


def test_leader_moves_names_each_moved_partition():
    before = {"src[0]": 1, "src[1]": 2, "src[2]": None}
    after = {"src[0]": 3, "src[1]": 2, "src[2]": 1}
    assert leader_moves(before, after) == ["the leader of src[0] moved from broker 1 to broker 3"]
    assert leader_moves(before, before) == []


def test_generator_is_seeded_and_recount_matches():
    lines = generate_lines(2000, ips=10, span_seconds=30, out_of_order=0.2, malformed=0.05, start=T0, seed=3)
    assert lines == generate_lines(2000, ips=10, span_seconds=30, out_of_order=0.2, malformed=0.05, start=T0, seed=3)
    bad = [line for line in lines if line.malformed]
    assert 40 < len(bad) < 180
    counts = expected_counts(lines)
    assert sum(counts.values()) == 2000 - len(bad)
    assert all(start.second % 5 == 0 for start, _ in counts)


def test_generations_a_minute_apart_do_not_overlap():
    # A second `make demo` a minute after the first: none of its lines may fall behind the first's watermark.
    first = generate_lines(10_000, ips=20, span_seconds=60, out_of_order=0.1, start=T0, seed=7)
    second = generate_lines(10_000, ips=20, span_seconds=60, out_of_order=0.1, start=T0 + timedelta(seconds=60),
                            seed=7)
    first_times = [line.event_time for line in first if not line.malformed]
    second_times = [line.event_time for line in second if not line.malformed]
    assert min(first_times) == T0 and max(first_times) < min(second_times) == T0 + timedelta(seconds=60)
    watermark = max(first_times) - timedelta(seconds=5)
    assert all(when - timedelta(seconds=when.second % 5) + timedelta(seconds=5) > watermark for when in second_times)
    assert not set(expected_counts(first)) & set(expected_counts(second))


def test_default_start_follows_the_wall_clock():
    before = datetime.now(UTC).replace(microsecond=0)
    lines = generate_lines(600, span_seconds=60, out_of_order=0.0, malformed=0.0)
    after = datetime.now(UTC)
    assert before <= lines[0].event_time <= after
    assert all(before <= line.event_time < after + timedelta(seconds=60) for line in lines)


def test_invalid_client_addresses_are_malformed_by_ipaddress():
    lines = generate_lines(3000, malformed=0.3, start=T0, seed=5)
    invalid = [line for line in lines if line.ip in INVALID_ADDRESSES]
    assert {line.ip for line in invalid} == set(INVALID_ADDRESSES)
    for line in invalid:  # a well-formed line, but for its address: only ipaddress makes it a dead letter
        assert line.malformed and line.event_time is not None and line.value.startswith(line.ip.encode() + b" - - [")
    assert all(ipaddress.ip_address(line.ip) for line in lines if not line.malformed)
    assert not LogLine(format_line("2001:db8::1", T0), "2001:db8::1", T0).malformed
    assert LogLine(format_line("999.1.1.1", T0), "999.1.1.1", T0).malformed
    assert sum(expected_counts(lines).values()) == sum(1 for line in lines if not line.malformed)


def test_event_time_of_reads_back_what_format_line_wrote() -> None:
    from datetime import UTC, datetime

    from microbatch.dev.datagen import event_time_of, format_line

    when = datetime(2026, 11, 25, 7, 1, 2, tzinfo=UTC)
    assert event_time_of(format_line("10.0.0.1", when)) == when
    assert event_time_of(b"not a log line") is None
    assert event_time_of(None) is None
    assert event_time_of(b'1.2.3.4 - - [99/Foo/2026:00:00:00 +0000] "GET /"') is None
