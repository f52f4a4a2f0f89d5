"""The ledger's guarantees on a real PostgreSQL: compare-and-set, the overlap constraint,
concurrent commits of one batch, and the no-op retry. Staged rows are written with SQL here,
as Spark would, so these tests need no Spark."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from microbatch.config import find_spec
from microbatch.errors import ConcurrentCommitError, MicrobatchError, ZombieAttemptError
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, stage_lock, transaction
from microbatch.phases.commit import commit_batch
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange, Plan

pytestmark = pytest.mark.integration
SPEC = find_spec("ip_count")
W0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
W1 = datetime(2026, 11, 22, 12, 0, 5, tzinfo=UTC)


def plan_and_stage(url: str, ranges: list[OffsetRange], rows: list[tuple[str, int]]) -> tuple[int, int]:
    """Insert a planned batch, take an attempt, stage `rows` (ip, count) and record it staged."""
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch = repo.insert_batch(session, pipeline, Plan(ranges=tuple(ranges)))
        batch_id = batch.id
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
        for ip, count in rows:
            session.execute(
                text(
                    "INSERT INTO stage_ip_counts (batch_id, attempt, window_start, window_end, ip, count, topic,"
                    " partition) VALUES (:b, :a, :ws, :we, :ip, :c, :t, :p)"
                ),
                {"b": batch_id, "a": attempt, "ws": W0, "we": W1, "ip": ip, "c": count,
                 "t": ranges[0].topic, "p": ranges[0].partition},
            )
    with transaction(url) as session:
        repo.record_staged(session, batch_id, attempt, {"rows_by_sink": {"ip_counts": len(rows)}}, {"n": 1}, {})
    return batch_id, attempt


def sink(url: str) -> dict[str, int]:
    with transaction(url) as session:
        return dict(session.execute(text("SELECT ip, count FROM ip_counts")).all())


def positions(url: str) -> dict[str, int]:
    with transaction(url) as session:
        rows = session.execute(text("SELECT topic || '[' || partition || ']', next_offset FROM positions")).all()
    return dict(rows)


def test_commit_moves_positions_merges_rows_and_clears_staging(ledger_url):
    batch_id, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 4)],
                                 [("10.0.0.1", 3), ("10.0.0.2", 2)])
    with transaction(ledger_url) as session:
        result = commit_batch(session, SPEC, batch_id)
    assert not result.already_committed
    assert result.rows_by_sink == {"ip_counts": 2}
    assert positions(ledger_url) == {"t[0]": 10, "t[1]": 4}
    assert sink(ledger_url) == {"10.0.0.1": 3, "10.0.0.2": 2}
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM stage_ip_counts")).scalar_one() == 0
        assert session.execute(text("SELECT state FROM batches WHERE id = :b"), {"b": batch_id}).scalar_one() == (
            "committed"
        )
        assert session.execute(text("SELECT state FROM pipelines")).scalar_one() == {"n": 1}

    # A second batch of the same window adds to the existing rows: partial counts are exact.
    second, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 10, 12)], [("10.0.0.1", 4)])
    with transaction(ledger_url) as session:
        commit_batch(session, SPEC, second)
    assert sink(ledger_url) == {"10.0.0.1": 7, "10.0.0.2": 2}
    assert positions(ledger_url) == {"t[0]": 12, "t[1]": 4}


def test_retry_after_commit_is_a_noop(ledger_url):
    batch_id, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 5)], [("10.0.0.1", 5)])
    with transaction(ledger_url) as session:
        commit_batch(session, SPEC, batch_id)
    with transaction(ledger_url) as session:
        again = commit_batch(session, SPEC, batch_id)
    assert again.already_committed
    assert sink(ledger_url) == {"10.0.0.1": 5}
    assert positions(ledger_url) == {"t[0]": 5}


def test_compare_and_set_refuses_a_stale_start_and_rolls_back_everything(ledger_url):
    first, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 5)], [("10.0.0.1", 5)])
    with transaction(ledger_url) as session:
        commit_batch(session, SPEC, first)
    # A backfill-like batch that still believes partition 0 starts at 0, plus a fresh partition 1.
    with transaction(ledger_url) as session:
        session.execute(text("UPDATE batches SET kind = 'backfill' WHERE id = :b"), {"b": first})
    stale, _ = plan_and_stage(ledger_url, [OffsetRange("t", 1, 0, 3), OffsetRange("t", 0, 0, 5)],
                              [("10.0.0.9", 1)])
    with pytest.raises(ConcurrentCommitError, match=r"t\[0\]: the ledger position is 5, not 0"):
        with transaction(ledger_url) as session:
            commit_batch(session, SPEC, stale)
    # Nothing of the stale batch landed: not partition 1's position, not its rows.
    assert positions(ledger_url) == {"t[0]": 5}
    assert sink(ledger_url) == {"10.0.0.1": 5}


def test_exclusion_constraint_refuses_overlapping_committed_ranges(ledger_url):
    batch_id, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 10)], [])
    with transaction(ledger_url) as session:
        commit_batch(session, SPEC, batch_id)
    with pytest.raises(IntegrityError, match="ex_ranges_no_overlap"), transaction(ledger_url) as session:
        session.execute(
            text(
                "INSERT INTO ranges (batch_id, pipeline_id, topic, partition, start_offset, end_offset, committed) "
                "SELECT id, pipeline_id, 't', 0, 9, 15, true FROM batches WHERE id = :b"
            ),
            {"b": batch_id},
        )
    # Adjacent ranges share no offset and are accepted; other partitions are independent.
    with transaction(ledger_url) as session:
        session.execute(
            text(
                "INSERT INTO ranges (batch_id, pipeline_id, topic, partition, start_offset, end_offset, committed) "
                "SELECT id, pipeline_id, 't', p, s, e, true FROM batches, "
                "(VALUES (0, 10, 15), (1, 0, 10)) AS v(p, s, e) WHERE id = :b"
            ),
            {"b": batch_id},
        )


def test_two_concurrent_commits_of_one_batch_commit_once(ledger_url):
    batch_id, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 8)], [("10.0.0.1", 8)])
    barrier = threading.Barrier(2)
    results, errors = [], []

    def commit() -> None:
        try:
            barrier.wait()
            with transaction(ledger_url) as session:
                results.append(commit_batch(session, SPEC, batch_id))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(r.already_committed for r in results) == [False, True]
    assert sink(ledger_url) == {"10.0.0.1": 8}
    assert positions(ledger_url) == {"t[0]": 8}


def test_zombie_attempt_cannot_stage_or_commit(ledger_url):
    batch_id, old_attempt = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 4)], [("10.0.0.1", 4)])
    with transaction(ledger_url) as session:
        new_attempt = repo.begin_attempt(session, batch_id)
    assert new_attempt == old_attempt + 1
    with pytest.raises(ZombieAttemptError, match="superseded"), transaction(ledger_url) as session:
        repo.record_staged(session, batch_id, old_attempt, {}, {}, {})
    with pytest.raises(ZombieAttemptError, match="not staged by its current attempt"):
        with transaction(ledger_url) as session:
            commit_batch(session, SPEC, batch_id)
    assert sink(ledger_url) == {}
    assert positions(ledger_url) == {}


def test_a_batch_already_in_a_lakehouse_table_cannot_be_abandoned(ledger_url):
    batch_id, attempt = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 4)], [("10.0.0.1", 4)])
    with transaction(ledger_url) as session:
        pipeline_id = repo.get_batch(session, batch_id).pipeline_id
        session.execute(text("INSERT INTO lake_commits (batch_id, sink, pipeline_id, attempt, location, "
                             "table_version, rows) VALUES (:b, 'lake', :p, :a, '/w/lake', 3, 4)"),
                        {"b": batch_id, "p": pipeline_id, "a": attempt})
    with pytest.raises(MicrobatchError, match="already in version 3 of /w/lake") as refused:
        with transaction(ledger_url) as session:
            repo.abandon_open_batch(session, pipeline_id, batch_id, "test")
    assert "Run the pipeline again" in refused.value.fix
    with transaction(ledger_url) as session:
        assert repo.get_batch(session, batch_id).state == "staged"


def test_open_scheduled_batches_all_belong_to_one_plan(ledger_url):
    """The database refuses a second plan while one is open; a run's later batches name its first (run_head)."""
    first, _ = plan_and_stage(ledger_url, [OffsetRange("t", 0, 0, 4)], [])
    with pytest.raises(IntegrityError, match="ex_batches_one_open_plan"), transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC)
        repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange("t", 0, 4, 8),)))
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC)
        pid = pipeline.id
        later = repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange("t", 0, 4, 8),)), run_head=first)
        assert [b.id for b in repo.find_open_batches(session, pid)] == [first, later.id]
        assert repo.open_predecessor(session, later).id == first
        followers = [later.id,
                     repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange("t", 0, 8, 9),)), run_head=first).id]
    with transaction(ledger_url) as session:  # abandoning the run's first batch closes the ones after it
        assert repo.abandon_open_batch(session, pid, first, "test") == "staged"
        assert repo.abandon_followers(session, pid, first, "test") == followers
        assert repo.find_open_batches(session, pid) == []


def test_a_concurrent_stage_waits_for_the_live_one_instead_of_superseding_it(ledger_url):
    """Regression (chaos harness): four concurrent runs of one batch superseded each other's attempts in
    turn for 12 minutes. Now the second stage waits on the batch's advisory lock, then finds the batch
    staged and leaves it to the commit: no new attempt, one commit."""
    from microbatch.phases.stage import stage_batch

    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch_id = repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange("t", 0, 0, 3),))).id
    outcome: list[object] = []
    with stage_lock(ledger_url, batch_id) as waited:  # the live stage
        assert waited is False
        with transaction(ledger_url) as session:
            attempt = repo.begin_attempt(session, batch_id)
        second = threading.Thread(target=lambda: outcome.append(
            stage_batch(None, SPEC, batch_id, Ledger(ledger_url), KafkaSettings(""))))
        second.start()
        time.sleep(2)
        assert second.is_alive() and outcome == []  # it waits; it did not take a new attempt
        with transaction(ledger_url) as session:
            session.execute(text(
                "INSERT INTO stage_ip_counts (batch_id, attempt, window_start, window_end, ip, count, topic, partition)"
                " VALUES (:b, :a, :ws, :we, '10.0.0.9', 3, 't', 0)"), {"b": batch_id, "a": attempt, "ws": W0, "we": W1})
            repo.record_staged(session, batch_id, attempt, {"rows_by_sink": {"ip_counts": 1}}, {}, {})
    second.join(timeout=30)
    assert outcome == [None]
    with transaction(ledger_url) as session:
        assert repo.get_batch(session, batch_id).attempt == attempt
        assert commit_batch(session, SPEC, batch_id).attempt == attempt
    assert sink(ledger_url) == {"10.0.0.9": 3}


def test_stage_lock_of_a_killed_holder_is_released_and_a_hung_holder_times_out(ledger_url):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom microbatch.ledger.database import stage_lock\n"
         "with stage_lock(sys.argv[1], 77):\n    print('locked', flush=True)\n    time.sleep(120)\n", ledger_url],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(MicrobatchError, match="Batch 77 is still being staged by another run after 1s"):
            with stage_lock(ledger_url, 77, wait_s=1, poll_s=0.2):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        started = time.monotonic()
        with stage_lock(ledger_url, 77, wait_s=20, poll_s=0.2):
            assert time.monotonic() - started < 20
    finally:
        holder.kill()
