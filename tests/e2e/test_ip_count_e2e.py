"""The whole path on real services: Kafka -> Airflow dag.test() -> spark-submit -> Postgres.

Each test produces access-log lines, runs the ip_count DAG until the ledger reaches the end,
and compares the sink with a recount of the produced lines made here, independently.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import make_url, text

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    assert_exactly_once,
    cli,
    expected_positions,
    run_log,
    run_pipeline,
    write_test_spec,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def pipeline_env(service_env, topic, tmp_path, kafka):
    # The JVM's own defaults, as a user's spec has them (the other spark-submit tests tune their drivers:
    # helpers.SHORT_LIVED_DRIVER).
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=10_000, bootstrap=kafka.bootstrap_servers,
                            spark_mode="submit", jvm_defaults=True)
    return {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}


def test_ip_count_end_to_end_then_only_new_offsets(pipeline_env, topic, kafka, ledger_url):
    lines = generate_lines(10_000, ips=40, span_seconds=120, out_of_order=0.15, malformed=0.03, seed=11,
                           start=datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC))
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)
    assert len({p for p, _ in coords}) == 4

    result = run_pipeline(pipeline_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_exactly_once(ledger_url, pipeline_env, lines, coords, f"{topic}_out")
    with transaction(ledger_url) as session:
        batches = session.execute(text("SELECT count(*), sum((counts->>'records')::int) FROM batches "
                                       "WHERE state = 'committed'")).one()
    assert batches[0] == 1  # 10,000 offsets in one batch (each batch is a spark-submit)
    assert batches[1] == 10_000

    # The task logs say what was read, staged and committed.
    log = run_log(result)
    assert "plan ip_count: planned batch" in log
    assert "records, lag after this batch" in log
    assert "rows merged into ip_counts" in log
    assert "nothing new to read" in log
    password = make_url(ledger_url).password
    assert password and password not in log, "a secret leaked into the task logs"

    more = generate_lines(1_500, ips=40, span_seconds=30, malformed=0.05, seed=12,
                          start=datetime(2026, 11, 22, 12, 5, 0, tzinfo=UTC))
    more_coords = produce_lines(kafka.bootstrap_servers, topic, more)
    result = run_pipeline(pipeline_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_exactly_once(ledger_url, pipeline_env, lines + more, coords + more_coords, f"{topic}_out")
    with transaction(ledger_url) as session:
        last = session.execute(text(
            "SELECT sum(end_offset - start_offset) FROM ranges r JOIN batches b ON b.id = r.batch_id "
            "WHERE b.id = (SELECT max(id) FROM batches)"
        )).scalar_one()
    assert last == 1_500  # the new run read only the new offsets

    # The operator CLI, against the ledger of this real run.
    status = json.loads(cli(pipeline_env, "status", "ip_count", "--json").stdout)["ip_count"]
    assert {row["partition"]: row["position"] for row in status} == expected_positions(coords + more_coords)
    assert all(row["lag"] == 0 for row in status)
    history = json.loads(cli(pipeline_env, "history", "ip_count", "--json").stdout)
    assert [b["state"] for b in history] == ["committed"] * len(history)
    assert sum(b["records"] for b in history) == 11_500
    partition, offset = more_coords[10]
    found = json.loads(cli(pipeline_env, "find", "ip_count", topic, str(partition), str(offset), "--json").stdout)
    assert found["kind"] == "batch" and found["batch_id"] == history[0]["id"]
    assert found["airflow_run_id"] == history[0]["airflow_run_id"]
    assert cli(pipeline_env, "find", "ip_count", topic, str(partition), "999999").returncode == 1
    assert cli(pipeline_env, "verify", "ip_count").returncode == 0

    # A deliberately corrupted range: verify fails and names the hole.
    with transaction(ledger_url) as session:
        session.execute(text("UPDATE ranges SET end_offset = end_offset - 3 WHERE id = (SELECT min(id) FROM ranges)"))
    broken = cli(pipeline_env, "verify", "ip_count")
    assert broken.returncode == 1
    assert "are in no committed range and no gap" in broken.stdout

