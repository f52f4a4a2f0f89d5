"""The fast subset of the chaos harness: one SIGKILL of each fault kind while the shipped clicks pipeline runs
continuously on 4,000 JSON clicks (its row sinks: append, aggregate, upsert with tombstones, kafka), staging on
the suite's Spark Connect server (the shipped `spark.mode: auto` on one machine); then every exactly-once check of
the full harness must pass.

spark-submit's own fault kinds (its driver and its Python workers killed) are
tests/chaos/test_crash_recovery.py::test_spark_submit_driver_and_worker_deaths_are_retried_within_the_run's and
`make chaos`'s (the full harness, ip_count on spark-submit, every kind three times by SIGKILL and by SIGTERM);
ip_count through faults is also the three-broker subset's (test_harness_cluster.py)."""

from __future__ import annotations

import signal

import pytest

from tests.chaos.harness import Harness, run_and_check

pytestmark = pytest.mark.chaos

CONNECT_SCHEDULE = [
    ("restart the Kafka broker", signal.SIGKILL),
    ("kill the process running the commit", signal.SIGKILL),
    ("kill the publisher after its Kafka commit", signal.SIGKILL),
    ("restart Postgres during a commit", signal.SIGKILL),
    ("start a duplicate concurrent run (zombie)", signal.SIGKILL),
    ("start a backfill overlapping the scheduled range", signal.SIGKILL),
]


def test_chaos_fast_subset_clicks_through_spark_connect(tmp_path, spark_connect):
    harness = Harness(tmp_path, records=4_000, chunks=len(CONNECT_SCHEDULE), batch_size=4_000, seed=7,
                      liveness_bound_s=300, pipeline="clicks", spark_remote=spark_connect.remote)
    assert set(harness.fault_kinds()) == {name for name, _ in CONNECT_SCHEDULE}  # every kind that applies, once
    run_and_check(harness, CONNECT_SCHEDULE, spacing_s=(0.5, 2))
