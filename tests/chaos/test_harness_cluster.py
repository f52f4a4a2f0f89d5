"""The fast subset of the chaos harness on a three-broker KRaft cluster (RF 3, min.insync.replicas 2): one
SIGKILL of four of the five cluster fault kinds while ip_count runs continuously over six source partitions,
staging on the suite's Spark Connect server (the faults are the brokers', not Spark's), then every exactly-once
check of the full harness must pass. The fifth kind, the leader of an output partition killed inside a publisher
transaction, is `make chaos-cluster`'s (every kind, three times, by SIGKILL and SIGTERM): its transaction is the
one the coordinator's death below aborts here."""

from __future__ import annotations

import signal

import pytest

from tests.chaos.harness import Harness, run_and_check

pytestmark = pytest.mark.chaos

SCHEDULE = [
    ("kill the leader of a source partition as the stage reads it", signal.SIGKILL),
    ("kill the transaction coordinator of the sink's transactional_id", signal.SIGKILL),
    ("kill a broker while plan lists offsets", signal.SIGKILL),
    ("take two brokers down at once (min.insync.replicas 2 refuses writes)", signal.SIGKILL),
]


def test_chaos_cluster_fast_subset(tmp_path, spark_connect):
    harness = Harness(tmp_path, records=6_000, chunks=len(SCHEDULE), batch_size=6_000, seed=11,
                      liveness_bound_s=300, cluster=True, partitions=6, spark_remote=spark_connect.remote)
    kinds = set(harness.fault_kinds())
    assert {name for name, _ in SCHEDULE} == kinds - {"kill the leader of an output partition inside a publisher "
                                                      "transaction"}  # every other cluster kind, once
    run_and_check(harness, SCHEDULE, spacing_s=(0.5, 1))
    two_down = next(f for f in harness.faults if f.name.startswith("take two brokers down"))
    assert "not acknowledged" in two_down.detail, two_down.detail  # min.insync.replicas 2 held meanwhile
