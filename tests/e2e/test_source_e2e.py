"""Source semantics through the whole path (Airflow dag.test + spark-submit + Postgres): partitions added
between runs are read from their first record, and a backlog split into several Spark tasks
(`min_spark_partitions`) gives exactly the independent recount of the input."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from kafka import KafkaAdminClient

from microbatch.config import find_spec
from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import Ledger
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from tests.e2e.helpers import assert_exactly_once, run_log, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e


def test_new_partitions_and_split_reads_count_every_record(service_env, tmp_path, kafka, ledger_url):
    bootstrap = kafka.bootstrap_servers
    topic = f"grow_{tmp_path.name[-8:].replace('-', '_')}"
    create_topic(bootstrap, topic, 2)
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=100_000, bootstrap=bootstrap)
    path = specs / "ip_count.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["source"].update(min_spark_partitions=6, startup="latest")  # latest: only for the first plan
    path.write_text(yaml.safe_dump(spec))
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}

    # The pipeline's first plan pins the two partitions at their (empty) latest offsets and reads nothing.
    assert plan_next_batch(find_spec("ip_count", specs), Ledger(ledger_url), KafkaSettings(bootstrap)).batch_id is None
    lines = generate_lines(3_000, ips=30, span_seconds=60, malformed=0.02, seed=31,
                           start=datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC))
    coords = produce_lines(bootstrap, topic, lines)

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_partitions({topic: 4})
    admin.close()
    create_topic(bootstrap, topic, 4)  # waits until the new partitions have leaders
    more = generate_lines(3_000, ips=30, span_seconds=60, malformed=0.02, seed=32,
                          start=datetime(2026, 11, 22, 12, 1, 0, tzinfo=UTC))
    more_coords = produce_lines(bootstrap, topic, more)
    assert {p for p, _ in more_coords} >= {2, 3}, "the producer did not use the new partitions"

    result = run_pipeline(env, max_runs=3)
    log = run_log(result)
    assert result.returncode == 0, log[-3000:]
    assert f"new partition {topic}[2]: starts at 0 (earliest: found after the pipeline started)" in log
    assert "lag total: 0 offset(s) over 4 partition(s) after this plan" in log
    # Every record of the old and the new partitions, exactly once, equal to the recount (the unsplit result).
    assert_exactly_once(ledger_url, env, lines + more, coords + more_coords, f"{topic}_out")
