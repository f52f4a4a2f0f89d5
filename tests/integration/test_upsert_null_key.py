"""A postgres_upsert row with a null key is refused by the commit in one terminal sentence naming the sink, the
key and the first record's coordinates; nothing is committed (no row, no position, the batch stays staged)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.errors import SpecError
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.phases.commit import commit_batch
from microbatch.types import OffsetRange, Plan

pytestmark = pytest.mark.integration
SPEC = find_spec("clicks")  # the shipped spec: migrate (the ledger_url fixture) made its tables
TS = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)


def test_a_null_upsert_key_is_one_terminal_sentence_and_nothing_is_committed(ledger_url):
    ranges = [OffsetRange("clicks_source", 0, 0, 2)]
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch_id = repo.insert_batch(session, pipeline, Plan(ranges=tuple(ranges))).id
    with transaction(ledger_url) as session:
        attempt = repo.begin_attempt(session, batch_id)
        for offset, user in ((0, "u1"), (1, None)):
            session.execute(text(
                'INSERT INTO stage_user_last_page (batch_id, attempt, "user", page, ts, forget, topic, partition, '
                '"offset") VALUES (:b, :a, :u, :p, :ts, false, :t, 0, :o)'),
                {"b": batch_id, "a": attempt, "u": user, "p": "/", "ts": TS, "t": "clicks_source", "o": offset})
    with transaction(ledger_url) as session:
        repo.record_staged(session, batch_id, attempt, {"rows_by_sink": {"user_last_page": 2}}, {}, {})

    with pytest.raises(SpecError) as refused, transaction(ledger_url) as session:
        commit_batch(session, SPEC, batch_id)
    assert not refused.value.retryable
    assert str(refused.value).startswith(
        "sink 'user_last_page': 1 record(s) of batch") and "null key (user), the first at clicks_source[0] offset 1" \
        in str(refused.value), str(refused.value)
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT state FROM batches WHERE id = :b"), {"b": batch_id}).scalar_one() == \
            "staged"
        assert session.execute(text("SELECT count(*) FROM user_last_page")).scalar_one() == 0
        assert session.execute(text("SELECT count(*) FROM positions")).scalar_one() == 0
