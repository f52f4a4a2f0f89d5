"""The fast subset of the chaos harness: one SIGKILL of each fault kind while the pipeline runs continuously,
on 10,000 access-log lines for ip_count (by spark-submit, whose driver and Python workers are among the faults)
and on 4,000 JSON clicks for the shipped clicks pipeline (its row sinks: append, aggregate, upsert with
tombstones, kafka; through Spark Connect); then every exactly-once check of the full harness, for that
pipeline, must pass."""

from __future__ import annotations

import signal

import pytest

from tests.chaos.harness import Harness, run_and_check

pytestmark = pytest.mark.chaos

SCHEDULE = [
    ("kill the spark-submit driver", signal.SIGKILL),
    ("kill a Spark Python worker", signal.SIGKILL),
    ("restart the Kafka broker", signal.SIGKILL),
    ("kill the process running the commit", signal.SIGKILL),
    ("kill the publisher after its Kafka commit", signal.SIGKILL),
    ("restart Postgres during a commit", signal.SIGKILL),
    ("start a duplicate concurrent run (zombie)", signal.SIGKILL),
    ("start a backfill overlapping the scheduled range", signal.SIGKILL),
]


def test_chaos_fast_subset(tmp_path):
    harness = Harness(tmp_path, records=10_000, chunks=len(SCHEDULE), batch_size=10_000, seed=7, liveness_bound_s=300)
    run_and_check(harness, SCHEDULE, spacing_s=(0.5, 2))


# The clicks pipeline stages on the suite's Spark Connect server (the shipped `spark.mode: auto` on one machine);
# killing spark-submit's driver and Python workers is the ip_count subset's.
CONNECT_SCHEDULE = [(name, sig) for name, sig in SCHEDULE if "Spark" not in name and "spark-submit" not in name]


def test_chaos_fast_subset_clicks_through_spark_connect(tmp_path, spark_connect):
    harness = Harness(tmp_path, records=4_000, chunks=len(CONNECT_SCHEDULE), batch_size=4_000, seed=7,
                      liveness_bound_s=300, pipeline="clicks", spark_remote=spark_connect.remote)
    assert set(harness.fault_kinds()) == {name for name, _ in CONNECT_SCHEDULE}  # every kind that applies, once
    run_and_check(harness, CONNECT_SCHEDULE, spacing_s=(0.5, 2))
