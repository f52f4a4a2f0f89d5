"""A sink with `contributions: per_batch`, end to end on real Kafka, Postgres and Spark: the stage sums the job's
per-partition rows per key, the commit keeps one contribution per key and batch, and a replay of one partition's
range recomputes every partition of the batches it touches, so the totals still equal an independent recount."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    assert_exactly_once,
    cli,
    late_coordinates,
    run_log,
    run_pipeline,
    sink_counts,
    write_test_spec,
)

pytestmark = pytest.mark.e2e

TABLE = "ip_counts_by_batch"


def test_per_batch_contributions_stage_keys_alone_and_a_replay_recomputes_whole_batches(
        service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=700, bootstrap=kafka.bootstrap_servers,
                            batches_per_run=3)  # the three batches in one DAG run
    spec_path = specs / "ip_count.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["sinks"][0].update(table=TABLE, contributions="per_batch")
    spec_path.write_text(yaml.safe_dump(spec))
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    lines = generate_lines(2_000, ips=10, span_seconds=30, malformed=0.03, seed=61,
                           start=datetime(2026, 11, 22, 14, 0, 0, tzinfo=UTC))
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)
    first = run_pipeline(env)
    assert first.returncode == 0, first.stdout[-3000:]
    assert_exactly_once(ledger_url, env, lines, coords, output_topic=f"{topic}_out", table=TABLE)
    with transaction(ledger_url) as session:
        staged_per_batch = session.execute(text(
            f"SELECT batch_id, count(*), count(DISTINCT (window_start, ip)) FROM {TABLE}_contributions "
            "GROUP BY batch_id ORDER BY batch_id")).all()
        ranges = session.execute(text(
            "SELECT batch_id, partition, start_offset, end_offset FROM ranges WHERE committed "
            "ORDER BY batch_id, partition")).all()
    assert len(staged_per_batch) >= 3, staged_per_batch
    assert all(rows == keys for _, rows, keys in staged_per_batch), "one contribution per key and batch"
    sink_before, late_before = sink_counts(ledger_url, TABLE), late_coordinates(ledger_url)

    # The job changes: two clients are left out, one whose records are in partition 0 and one whose records are
    # elsewhere (records are keyed by client). Then a range of partition 0 inside the first batch is replayed.
    good = [(coord, line) for coord, line in zip(coords, lines, strict=True) if not line.malformed]
    in_zero = Counter(line.ip for (p, _), line in good if p == 0).most_common(1)[0][0]
    elsewhere_ip = Counter(line.ip for (p, _), line in good if p != 0 and line.ip != in_zero).most_common(1)[0][0]
    excluded = {in_zero, elsewhere_ip}
    spec["job"].setdefault("options", {})["exclude_ips"] = sorted(excluded)
    spec_path.write_text(yaml.safe_dump(spec))
    first_batch = ranges[0][0]
    touched = [(p, s, e) for b, p, s, e in ranges if b == first_batch]
    p0 = next(r for r in touched if r[0] == 0)
    assert len(touched) > 1 and p0[2] - p0[1] > 2, touched
    done = cli(env, "backfill", "ip_count", "--topic", topic, "--mode", "replay", "--partitions", "0",
               "--start", str(p0[1] + 1), "--end", str(p0[2] - 1))
    log = run_log(done)
    assert done.returncode == 0, log[-4000:]
    assert f"added {len(touched) - 1} range(s) of other partitions" in log, log[-4000:]

    # Independent recount: the excluded client's good, on-time records in every partition of the first batch.
    replayed = {(p, offset) for p, s, e in touched for offset in range(s, e)}
    removed, elsewhere = Counter(), 0
    for coord, line in zip(coords, lines, strict=True):
        if coord in replayed and not line.malformed and line.ip in excluded and coord not in late_before:
            epoch = int(line.event_time.timestamp())
            removed[(datetime.fromtimestamp(epoch - epoch % 5, tz=UTC), line.ip)] += 1
            elsewhere += coord[0] != 0
    assert elsewhere > 0, "the client must have records in the batch's other partitions"
    assert sink_counts(ledger_url, TABLE) == sink_before - removed
    with transaction(ledger_url) as session:
        superseded = session.execute(text(
            "SELECT partition FROM ranges WHERE batch_id = :b AND superseded_by IS NOT NULL ORDER BY partition"),
            {"b": first_batch}).scalars().all()
    assert superseded == [p for p, _, _ in touched], "every partition of the batch is replayed"
    audit = cli(env, "verify", "ip_count")
    assert audit.returncode == 0, audit.stdout
