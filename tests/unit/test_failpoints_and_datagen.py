"""Failpoint arming (crash and pause), the leader-move sentence, and the data generator's independent recount."""

import ipaddress
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark import cloudpickle

from microbatch import failpoints
from microbatch.dev.datagen import INVALID_ADDRESSES, LogLine, expected_counts, format_line, generate_lines
from microbatch.kafka.offsets import leader_moves

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def test_failpoint_fires_once_with_marker_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(failpoints.FAILPOINTS_ENV, "commit.before_commit,stage.read=7")
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    assert failpoints.arming("stage.read") == failpoints.Arming("exit", limit=7)
    assert failpoints.point("commit.before_commit").arming() == failpoints.Arming("exit")
    assert failpoints.arming("stage.after_write") is None
    (tmp_path / "stage.read").touch()
    assert failpoints.arming("stage.read") is None


def test_failpoints_armed_by_file_while_running(tmp_path, monkeypatch):
    monkeypatch.delenv(failpoints.FAILPOINTS_ENV, raising=False)
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    assert failpoints.arming("publish.after_commit") is None
    (tmp_path / failpoints.ARMED_FILE).write_text("publish.after_commit=kill,stage.read=5")
    assert failpoints.arming("publish.after_commit") == failpoints.Arming("kill")
    assert failpoints.arming("stage.read") == failpoints.Arming("exit", limit=5)
    (tmp_path / failpoints.ARMED_FILE).write_text("")
    assert failpoints.arming("publish.after_commit") is None


def test_pause_failpoint_holds_once_and_marks(tmp_path, monkeypatch):
    monkeypatch.delenv(failpoints.FAILPOINTS_ENV, raising=False)
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    (tmp_path / failpoints.ARMED_FILE).write_text("plan.list_offsets=pause:0.2")
    started = time.monotonic()
    failpoints.point("plan.list_offsets").hit()  # holds, then goes on: the process does not die
    assert time.monotonic() - started >= 0.2
    assert (tmp_path / "plan.list_offsets").exists()
    started = time.monotonic()
    failpoints.point("plan.list_offsets").hit()  # fired once: the marker lets the next hit through at once
    assert time.monotonic() - started < 0.2


def test_a_released_pause_ends_before_its_seconds(tmp_path, monkeypatch):
    """A test that held a run at a pause and applied its fault releases it: the run goes on at its next look."""
    monkeypatch.delenv(failpoints.FAILPOINTS_ENV, raising=False)
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    (tmp_path / failpoints.ARMED_FILE).write_text("stage.before_read=pause:3600")
    naps: list[float] = []

    def nap(seconds: float) -> None:  # the fault is applied while the run holds: then the test releases it
        naps.append(seconds)
        assert (tmp_path / "stage.before_read").exists()  # marked before it holds
        if len(naps) == 3:
            failpoints.release("stage.before_read", tmp_path)

    monkeypatch.setattr(failpoints.time, "sleep", nap)
    failpoints.point("stage.before_read").hit()
    assert len(naps) == 3  # it looked once more after the release, and went on


def test_failpoint_syntax_keeps_every_old_form_and_adds_a_counted_kill():
    armed = failpoints.parse(" commit.before_commit, publish.after_commit=kill,publish.before_commit=pause:2.5,"
                             "stage.read=7:kill ")
    assert armed == {
        "commit.before_commit": failpoints.Arming("exit"),
        "publish.after_commit": failpoints.Arming("kill"),
        "publish.before_commit": failpoints.Arming("pause", seconds=2.5),
        "stage.read": failpoints.Arming("kill", limit=7),
    }
    assert failpoints.parse("stage.read") == {"stage.read": failpoints.Arming("exit", limit=0)}
    assert failpoints.parse("stage.read=12") == {"stage.read": failpoints.Arming("exit", limit=12)}
    assert failpoints.parse("stage.read=kill") == {"stage.read": failpoints.Arming("kill", limit=0)}
    assert failpoints.parse("") == {}


def test_unknown_failpoint_is_refused_at_declaration():
    with pytest.raises(ValueError, match=r"Unknown failpoint 'commit\.befor_commit'.*commit\.before_commit"):
        failpoints.point("commit.befor_commit")
    with pytest.raises(ValueError, match=r"Unknown failpoint 'stage\.after_read'"):
        failpoints.hit("stage.after_read")  # removed: no call site armed it


@pytest.mark.parametrize(("item", "reason"), [
    ("stage.reed=5", r"unknown failpoint: the registered ones are .*stage\.read"),
    ("stage.after_read", "unknown failpoint"),
    ("stage.read=pause:3", r"use one of stage\.read, stage\.read=N, stage\.read=kill, stage\.read=N:kill\."),
    ("plan.list_offsets=kill", r"use one of plan\.list_offsets=pause:S\."),
    ("plan.list_offsets", "not a form failpoint plan.list_offsets supports"),
    ("commit.before_commit=7", "not a form failpoint commit.before_commit supports"),
    ("commit.after_commit=pause:1", "not a form"),
    ("publish.before_commit=pause:soon", "not a form"),
    ("publish.after_commit=sigkill", "not a form"),
])
def test_bad_armed_item_is_refused_naming_it(item, reason, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=f"item '{re.escape(item)}' .*{reason}"):
        failpoints.parse(f"commit.after_commit,{item}")
    monkeypatch.setenv(failpoints.FAILPOINTS_ENV, item)
    monkeypatch.delenv(failpoints.FAILPOINT_DIR_ENV, raising=False)
    with pytest.raises(ValueError, match=f"^{failpoints.FAILPOINTS_ENV} item"):
        failpoints.armed()
    monkeypatch.delenv(failpoints.FAILPOINTS_ENV)
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(tmp_path))
    (tmp_path / failpoints.ARMED_FILE).write_text(item)
    with pytest.raises(ValueError, match=re.escape(failpoints.ARMED_FILE)):
        failpoints.hit("commit.after_commit")


ROOT = Path(__file__).resolve().parents[2]
DECLARED = re.compile(r"""\bpoint\(\s*["']([^"']+)["']""")
RAW_HIT = re.compile(r"""\b(?:hit|arming|crash)\(\s*["']""")


def test_registry_is_exactly_the_points_the_code_declares():
    sources = [path for folder in ("include", "spark_jobs") for path in sorted((ROOT / folder).rglob("*.py"))
               if path.name != "failpoints.py" or path.parent.name != "microbatch"]
    declared = {name for path in sources for name in DECLARED.findall(path.read_text())}
    unused = sorted(set(failpoints.REGISTRY) - declared)
    unknown = sorted(declared - set(failpoints.REGISTRY))
    assert not unused, f"registered failpoints no code declares with failpoints.point(...): {unused}"
    assert not unknown, f"failpoints declared but not registered: {unknown}"
    raw = [f"{path.relative_to(ROOT)}" for path in sources if RAW_HIT.search(path.read_text())]
    assert not raw, f"failpoints hit by a name string, not a declared point: {raw}"


def test_registry_modes_are_known():
    for name, registered in failpoints.REGISTRY.items():
        assert registered.modes, name
        assert registered.modes <= {failpoints.EXIT, failpoints.KILL, failpoints.PAUSE}, name
        assert failpoints.forms(name), name


@pytest.mark.parametrize(("mode", "returncode"), [("exit", failpoints.EXIT_CODE), ("kill", -9)])
def test_read_failpoint_fires_in_a_worker_without_the_failpoint_environment(mode, returncode, tmp_path, monkeypatch):
    """Spark Connect: the closure is built in the client, with the failpoint environment, and runs in a Python
    worker of the server, without it; the worker still dies by the armed mode and writes the client's marker."""
    from microbatch.phases import stage

    markers = tmp_path / "fired"
    monkeypatch.setenv(failpoints.FAILPOINTS_ENV, "stage.read=3" + (":kill" if mode == "kill" else ""))
    monkeypatch.setenv(failpoints.FAILPOINT_DIR_ENV, str(markers))

    class Plan:  # what _crash_after_records needs of a DataFrame: the Arrow function it maps with
        schema = None

        def mapInArrow(self, function, schema):  # PySpark's name
            self.function = function
            return self

    arming = stage.READ.arming()
    assert arming is not None
    guard = stage._crash_after_records(Plan(), arming, failpoints.env_marker_dir()).function
    worker_env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAILPOINT")}
    batches = "[type('Batch', (), {'num_rows': 2})() for _ in range(4)]"
    script = ("import sys; from pyspark import cloudpickle; guard = cloudpickle.loads(sys.stdin.buffer.read()); "
              f"print(sum(b.num_rows for b in guard({batches})))")
    worker = subprocess.run([sys.executable, "-c", script], input=cloudpickle.dumps(guard), env=worker_env,
                            capture_output=True, timeout=60, check=False)
    assert worker.returncode == returncode, worker.stderr.decode()[-2000:]
    assert (markers / "stage.read").exists()
    assert stage.READ.arming() is None  # the retry's plan reads the marker: the failpoint fired once


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
