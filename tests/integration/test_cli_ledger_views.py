"""`microbatch show` and `history` on a real PostgreSQL ledger, in process (issue 45): `show PIPELINE` prints every
sink, a Kafka sink by what it published; `history --json` gives each batch's ranges as data."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from microbatch.cli import app
from microbatch.config import find_spec
from microbatch.errors import SpecError
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from tests.integration.test_ui_ledger import commit_one_batch

pytestmark = pytest.mark.integration
SPEC = find_spec("ip_count")


@pytest.fixture
def cli(ledger_url, monkeypatch):
    monkeypatch.setenv("MICROBATCH_LEDGER_URL", ledger_url)
    monkeypatch.setenv("COLUMNS", "250")

    def run(*args: str) -> str:
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output
    return run


def published(url: str, written: int, sent: int) -> None:
    """ip_count's windows and outbox: `written` outbox rows of batch 1, of which the publisher sent `sent`."""
    with transaction(url) as session:
        pid = repo.get_pipeline(session, "ip_count").id
        session.execute(text(
            "INSERT INTO ip_counts (window_start, window_end, ip, count) SELECT timestamptz '2026-11-25 10:00:00Z' "
            "+ g * interval '5 s', timestamptz '2026-11-25 10:00:05Z' + g * interval '5 s', '10.0.0.' || g, g "
            "FROM generate_series(1, 4) g"))
        session.execute(text(
            "INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) SELECT :p, 'ip_count_sink', g, 1, "
            "'10.0.0.' || g, jsonb_build_object('ip', '10.0.0.' || g, 'count', g) FROM generate_series(1, :n) g"),
            {"p": pid, "n": written})
        repo.record_publish_progress(session, pid, "ip_count_sink", sent)


def test_show_without_a_sink_shows_every_sink_and_what_the_kafka_sink_published(ledger_url, cli):
    commit_one_batch(ledger_url)
    published(ledger_url, written=5, sent=3)
    everything = cli("show", "ip_count")
    table, topic = everything.index("ip_counts (postgres_aggregate): 4 rows, sum of count 10;"), everything.index(
        "ip_count_sink (kafka, topic ip_count_sink): 3 records published in 1 transaction(s), 2 waiting in the "
        "outbox; newest published")
    assert table < topic  # in spec order
    kafka_part = everything[topic:]
    assert '{"count": 3, "ip": "10.0.0.3"}' in kafka_part and '"10.0.0.4"' not in kafka_part  # sent only
    assert kafka_part.index('"10.0.0.3"') < kafka_part.index('"10.0.0.1"')  # newest first

    one = cli("show", "ip_count", "ip_counts", "--limit", "2")
    assert "ip_counts (postgres_aggregate)" in one and "ip_count_sink" not in one
    assert "10.0.0.4" in one and "10.0.0.1" not in one  # the largest sums first, two of them
    assert "ip_count_sink (kafka" in cli("show", "ip_count", "ip_count_sink")
    with pytest.raises(SpecError, match=re.escape("has no sink 'nosink'. Use one of: ip_counts, ip_count_sink.")):
        CliRunner().invoke(app, ["show", "ip_count", "nosink"], catch_exceptions=False)


def test_history_json_gives_the_ranges_as_data_and_the_table_names_the_steps(ledger_url, cli):
    commit_one_batch(ledger_url)
    with transaction(ledger_url) as session:  # batch 1's partition 1 replaced by a replay, batch 2
        pid = repo.get_pipeline(session, "ip_count").id
        session.execute(text("INSERT INTO batches (id, pipeline_id, kind, state, attempt) "
                             "VALUES (2, :p, 'replay', 'committed', 1)"), {"p": pid})
        session.execute(text("UPDATE ranges SET superseded_by = 2 WHERE batch_id = 1 AND partition = 1"))
        session.execute(text("UPDATE batches SET timings = '{\"plan_s\": 0.4, \"read_s\": 2.1, "
                             "\"stage_write_s\": 0.05, \"commit_s\": 0.2}' WHERE id = 1"))
    [replay, first] = json.loads(cli("history", "ip_count", "--json"))
    assert replay["id"] == 2 and replay["ranges"] == []
    assert first["ranges"] == [{"topic": "t", "partition": 0, "start": 0, "end": 7, "superseded_by": None},
                               {"topic": "t", "partition": 1, "start": 0, "end": 3, "superseded_by": 2}]
    table = cli("history", "ip_count")
    assert "t[0] [0, 7) t[1] [0, 3) replaced by 2" in table
    assert "plan=0.4 read+stage=2.1 dead+late=0.05 commit=0.2" in table
