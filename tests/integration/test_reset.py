"""`microbatch reset` on a real broker and ledger: refused while a batch is open, skipped offsets
become a gap the audit accepts, no move back over committed offsets, applied exactly once, audited."""

from __future__ import annotations

import pytest
from kafka import KafkaProducer
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, transaction
from microbatch.phases.commit import commit_batch
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from tests.e2e.helpers import cli, write_test_spec

pytestmark = pytest.mark.integration


def test_reset_rules(service_env, topic, kafka, ledger_url, tmp_path, monkeypatch):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=20, bootstrap=kafka.bootstrap_servers)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(specs))
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    for partition in range(4):
        for i in range(10):
            producer.send(topic, value=f"line {i}".encode(), partition=partition)
    producer.flush()
    producer.close()
    spec = find_spec("ip_count")

    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(kafka.bootstrap_servers))
    refused = cli(env, "reset", "ip_count", "--to", "latest", "--yes")
    assert refused.returncode == 2
    assert f"reset refused: batch(es) {outcome.batch_id} are still open" in refused.stdout

    with transaction(ledger_url) as session:
        attempt = repo.begin_attempt(session, outcome.batch_id)
    with transaction(ledger_url) as session:
        repo.record_staged(session, outcome.batch_id, attempt, {"rows_by_sink": {}}, {}, {})
    with transaction(ledger_url) as session:
        commit_batch(session, spec, outcome.batch_id)

    moved = cli(env, "reset", "ip_count", "--to", "offset", "--value", "8", "--partition", "0", "--yes")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT next_offset FROM positions WHERE partition = 0")).scalar_one() == 8
        gap = session.execute(text("SELECT start_offset, end_offset, reason FROM gaps")).one()
        audit = session.execute(text("SELECT old_offset, new_offset, target FROM position_resets")).all()
    assert (gap.start_offset, gap.end_offset) == (5, 8) and "reset --to offset" in gap.reason
    assert [tuple(a) for a in audit] == [(5, 8, "offset")]
    assert cli(env, "verify", "ip_count").returncode == 0  # the gap accounts for the skipped offsets
    found = cli(env, "find", "ip_count", topic, "0", "6")
    assert "was lost: gap [5, 8)" in found.stdout

    back = cli(env, "reset", "ip_count", "--to", "earliest", "--partition", "0", "--yes")
    assert back.returncode == 2
    assert "offsets [0, 8) are already committed; moving back would process them twice" in back.stdout

    again = cli(env, "reset", "ip_count", "--to", "offset", "--value", "8", "--partition", "0", "--yes")
    assert "nothing to change" in again.stdout

    unconfirmed = cli(env, "reset", "ip_count", "--to", "latest", "--partition", "1")  # no --yes, no stdin
    assert unconfirmed.returncode != 0
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM position_resets")).scalar_one() == 1
        assert session.execute(text("SELECT next_offset FROM positions WHERE partition = 1")).scalar_one() == 5
