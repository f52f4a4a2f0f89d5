"""`contributions: per_batch` on real Postgres: the commit keeps one contribution per key and batch, and refuses a
replay batch that recomputes only part of a committed batch (its retraction would take back the whole batch's
sums), with one sentence and nothing written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text

from microbatch.config import find_spec
from microbatch.errors import SpecError
from microbatch.ledger import repository as repo
from microbatch.ledger.database import get_engine, transaction
from microbatch.ledger.models import BatchKind, Range
from microbatch.phases.commit import commit_batch
from microbatch.sinks.schema import apply
from microbatch.types import OffsetRange, Plan

pytestmark = pytest.mark.integration
BASE = find_spec("ip_count")
TABLE = "ip_counts_pb"
SPEC = BASE.model_copy(update={"sinks": [BASE.sinks[0].model_copy(update={"table": TABLE,
                                                                         "contributions": "per_batch"})]})
W0, W1 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC), datetime(2026, 11, 22, 12, 0, 5, tzinfo=UTC)
P0, P1 = OffsetRange("src", 0, 0, 10), OffsetRange("src", 1, 0, 10)


def stage(url: str, ranges: tuple[OffsetRange, ...], rows: dict[str, int], kind: BatchKind = BatchKind.SCHEDULED,
          replaces: list[int] | None = None) -> int:
    """Plan a batch of `ranges`, stage `rows` (ip -> count, per key: no source columns) and record it staged."""
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch = repo.insert_batch(session, pipeline, Plan(ranges=ranges), kind=kind)
        if replaces is not None:
            batch.replaces, batch.state_before = replaces, {}
        batch_id = batch.id
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
        for ip, count in rows.items():
            session.execute(text(f"INSERT INTO stage_{TABLE} (batch_id, attempt, window_start, window_end, ip, count)"
                                 " VALUES (:b, :a, :ws, :we, :ip, :c)"),
                            {"b": batch_id, "a": attempt, "ws": W0, "we": W1, "ip": ip, "c": count})
        repo.record_staged(session, batch_id, attempt, {"rows_by_sink": {"ip_counts": len(rows)}}, {}, {})
    return batch_id


def sums(url: str) -> dict[str, int]:
    with transaction(url) as session:
        return dict(session.execute(text(f"SELECT ip, count FROM {TABLE}")).all())


def test_a_replay_of_part_of_a_batch_is_refused_when_contributions_are_per_batch(ledger_url):
    with get_engine(ledger_url).begin() as connection:
        apply(connection, SPEC)
    first = stage(ledger_url, (P0, P1), {"10.0.0.1": 7, "10.0.0.2": 3})
    with transaction(ledger_url) as session:
        commit_batch(session, SPEC, first)
    with transaction(ledger_url) as session:
        kept = session.execute(text(f"SELECT batch_id, ip, count FROM {TABLE}_contributions ORDER BY ip")).all()
        p0 = session.scalars(select(Range.id).where(Range.batch_id == first, Range.partition == 0)).one()
    assert [tuple(r) for r in kept] == [(first, "10.0.0.1", 7), (first, "10.0.0.2", 3)]

    # A replay planned per partition (before the sink became per_batch): partition 0 of the batch only.
    replay = stage(ledger_url, (P0,), {"10.0.0.1": 2}, kind=BatchKind.REPLAY, replaces=[p0])
    with pytest.raises(SpecError, match=rf"Replay batch {replay} recomputes only part of batch {first}, but sink "
                                        r"'ip_counts' keeps one contribution per batch"):
        with transaction(ledger_url) as session:
            commit_batch(session, SPEC, replay)
    assert sums(ledger_url) == {"10.0.0.1": 7, "10.0.0.2": 3}, "nothing was written"
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM ranges WHERE superseded_by IS NOT NULL")).scalar_one() == 0
