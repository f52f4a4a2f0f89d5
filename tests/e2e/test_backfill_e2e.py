"""Backfill `fill` end to end: history that lies before the pipeline's starting position is loaded
by the backfill DAG, without moving the scheduled cursor, exactly once, and published as
corrections; a dry run writes nothing; a second identical backfill does nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.datagen import generate_lines, produce_lines
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from tests.e2e.helpers import assert_exactly_once, cli, read_output, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e


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
    scheduled = run_pipeline(env)
    assert scheduled.returncode == 0, scheduled.stdout[-3000:]
    cursor = positions(ledger_url)

    dry = cli(env, "backfill", "ip_count", "--topic", topic, "--start", "0", "--end", "1000000", "--dry-run")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-2000:]
    log = dry.stdout + dry.stderr
    assert "dry run: nothing is written" in log
    assert "to fill" in log and "already committed, skipped" in log
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches WHERE kind = 'backfill'")).scalar_one() == 0

    done = cli(env, "backfill", "ip_count", "--topic", topic, "--start", "0", "--end", "1000000")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert positions(ledger_url) == cursor, "a backfill must not move the scheduled cursor"
    expected = assert_exactly_once(ledger_url, env, history + live, history_coords + live_coords)
    assert not (expected.late & set(history_coords))

    # The history windows were already final: they are published again, marked as corrections.
    published = read_output(kafka.bootstrap_servers, f"{topic}_out")
    corrections = [v for _, v in published if v.get("correction")]
    history_windows = {(start, ip) for (start, ip) in expected.counts if start.hour == 11}
    assert len(corrections) == len(history_windows)

    again = cli(env, "backfill", "ip_count", "--topic", topic, "--start", "0", "--end", "1000000")
    assert again.returncode == 0
    with transaction(ledger_url) as session:
        backfills = session.execute(text("SELECT count(*) FROM batches WHERE kind = 'backfill'")).scalar_one()
    assert backfills == 1, "the second identical fill found nothing left to do"
    assert cli(env, "verify", "ip_count").returncode == 0
