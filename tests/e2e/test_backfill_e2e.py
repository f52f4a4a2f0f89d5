"""Backfill `fill` end to end: history that lies before the pipeline's starting position is loaded
by the backfill DAG while the scheduled runs process new data on the same partitions, at the same
moment, in two processes; exactly once, without moving the scheduled cursor, and published as
corrections; a dry run writes nothing and announces what the fill then does; a second identical
backfill does nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV, release
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    assert_exactly_once,
    cli,
    migrated_airflow_home,
    read_output,
    run_log,
    write_test_spec,
)

pytestmark = pytest.mark.e2e


def committed_fills(url: str) -> int:
    with transaction(url) as session:
        return session.execute(text("SELECT count(*) FROM batches WHERE kind = 'backfill' AND state = 'committed'")
                               ).scalar_one()


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "microbatch.cli", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def fill_lines(output: str) -> list[str]:
    return sorted(line.split("  to fill ", 1)[1].split(" [microbatch]")[0]
                  for line in output.splitlines() if "  to fill " in line)


def positions(url: str) -> dict[int, int]:
    with transaction(url) as session:
        return dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())


def test_fill_history_before_the_start_position(service_env, topic, kafka, ledger_url, tmp_path, monkeypatch):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=100_000, bootstrap=kafka.bootstrap_servers)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    history = generate_lines(2_000, ips=15, span_seconds=60, malformed=0.03, seed=41,
                             start=datetime(2026, 11, 22, 11, 0, 0, tzinfo=UTC))
    history_coords = produce_lines(kafka.bootstrap_servers, topic, history)
    # The pipeline starts after the history (as `startup: latest` would): its positions are the current ends.
    ends: dict[int, int] = {}
    for partition, offset in history_coords:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, find_spec("ip_count"))
        for partition, end in ends.items():
            session.execute(text("INSERT INTO positions (pipeline_id, topic, partition, next_offset) "
                                 "VALUES (:p, :t, :n, :o)"), {"p": pipeline.id, "t": topic, "n": partition, "o": end})

    live = generate_lines(1_500, ips=15, span_seconds=30, malformed=0.02, seed=42,
                          start=datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC))
    live_coords = produce_lines(kafka.bootstrap_servers, topic, live)
    cursor = positions(ledger_url)

    # The fill runs under its own Airflow home: two `dag.test()` processes writing one SQLite metadata file at the
    # same moment can fail with "database is locked" (docs/operations.md). The ledger, Kafka and the specs are
    # shared, and they are what this test is about. Its home holds a migrated DB before the race.
    fill_env = {**env, "AIRFLOW_HOME": str(migrated_airflow_home(tmp_path / "airflow-fill"))}
    dry = cli(fill_env, "backfill", "ip_count", "--topic", topic, "--start", "0", "--end", "latest", "--dry-run")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-2000:]
    log = dry.stdout + dry.stderr
    assert "dry run: nothing is written" in log
    assert "to fill" in log and "at or after the scheduled position, left to the scheduled runs" in log
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches WHERE kind = 'backfill'")).scalar_one() == 0

    # The scheduled runs (the live data) and the fill (the history) run at the same moment, on the
    # same partitions, each in its own process. The scheduled stage holds after it has planned (a pause
    # failpoint, once), so that its open batch and the fill's overlap however fast a Connect stage is: until the
    # fill has committed, then it is released (at most 20 s).
    fired = tmp_path / "fired"
    hold = {FAILPOINTS_ENV: "stage.before_read=pause:20", FAILPOINT_DIR_ENV: str(fired)}
    scheduled = spawn({**env, **hold}, "run", "ip_count", "--max-runs", "10")
    filling = spawn(fill_env, "backfill", "ip_count", "--topic", topic, "--start", "0", "--end", "latest")
    while scheduled.poll() is None and filling.poll() is None and not (
            (fired / "stage.before_read").exists() and committed_fills(ledger_url)):
        time.sleep(0.2)
    release("stage.before_read", fired)
    done_out, _ = filling.communicate(timeout=900)
    scheduled_out, _ = scheduled.communicate(timeout=900)
    assert scheduled.returncode == 0, scheduled_out[-3000:]
    assert filling.returncode == 0, done_out[-3000:]
    assert fill_lines(run_log(done_out)) == fill_lines(log), "the dry run announced what the fill did"
    with transaction(ledger_url) as session:
        spans = session.execute(text(
            "SELECT kind, created_at, committed_at FROM batches WHERE state = 'committed'")).all()
    fills = [(c, d) for kind, c, d in spans if kind == "backfill"]
    runs = [(c, d) for kind, c, d in spans if kind == "scheduled"]
    assert fills and runs
    assert any(a < d and c < b for a, b in fills for c, d in runs), "the fill and a scheduled batch overlapped in time"
    assert positions(ledger_url) != cursor
    # Every final window is published exactly once with its exact count. History windows are published
    # as corrections when the fill committed after the live watermark existed, else as plain finals.
    expected = assert_exactly_once(ledger_url, env, history + live, history_coords + live_coords,
                                   output_topic=f"{topic}_out")
    assert not (expected.late & set(history_coords))
    published = read_output(kafka.bootstrap_servers, f"{topic}_out")
    corrections = {datetime.fromisoformat(v["window_start"]).hour for _, v in published if v.get("correction")}
    assert corrections <= {11}, "only history windows are corrections"

    again = cli(fill_env, "backfill", "ip_count", "--topic", topic, "--start", "0", "--end", "latest")
    assert again.returncode == 0
    with transaction(ledger_url) as session:
        backfills = session.execute(text("SELECT count(*) FROM batches WHERE kind = 'backfill'")).scalar_one()
    assert backfills == 1, "the second identical fill found nothing left to do"
    assert cli(env, "verify", "ip_count").returncode == 0
