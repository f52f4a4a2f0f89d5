"""Failpoint arming and the data generator's independent recount."""

from microbatch import failpoints
from microbatch.datagen import expected_counts, generate_lines


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


def test_generator_is_seeded_and_recount_matches():
    lines = generate_lines(2000, ips=10, span_seconds=30, out_of_order=0.2, malformed=0.05, seed=3)
    assert lines == generate_lines(2000, ips=10, span_seconds=30, out_of_order=0.2, malformed=0.05, seed=3)
    bad = [line for line in lines if line.malformed]
    assert 40 < len(bad) < 180
    counts = expected_counts(lines)
    assert sum(counts.values()) == 2000 - len(bad)
    assert all(start.second % 5 == 0 for start, _ in counts)
