"""Backfill `replay` end to end: after a change of the job's options, one partition's range is
recomputed, widened to whole committed batches; only that range's contribution changes, the
totals equal an independent recomputation, the replaced ranges stay in the ledger as superseded,
changed final windows are published again as corrections, and the dry run announced exactly
what the run then did. A replay of offsets never committed is refused before anything is written."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    assert_exactly_once,
    cli,
    dead_letter_coordinates,
    late_coordinates,
    positions,
    read_output,
    run_log,
    run_pipeline,
    sink_counts,
    write_test_spec,
)

pytestmark = pytest.mark.e2e


def partition_ranges(url: str, partition: int) -> list[tuple[int, int, int]]:
    """(batch id, start, end) of the committed ranges of one partition, in offset order."""
    with transaction(url) as session:
        return [tuple(r) for r in session.execute(text(
            "SELECT batch_id, start_offset, end_offset FROM ranges WHERE committed AND partition = :n "
            "ORDER BY start_offset"), {"n": partition}).all()]


def batch_count(url: str) -> int:
    with transaction(url) as session:
        return session.execute(text("SELECT count(*) FROM batches")).scalar_one()


def plan_lines(output: str) -> list[str]:
    """The "to replay" lines of a backfill's task log, without the logger's location suffix."""
    return sorted(line.split("  to replay ", 1)[1].split(" [microbatch]")[0]
                  for line in output.splitlines() if "  to replay " in line)


def check_lineage(url: str, events_file: Path, superseded: list) -> None:
    """One OpenLineage event per committed batch (scheduled and replay), sent by the commit tasks through the
    provider: its offset-range facet equals the ledger's ranges of the batch, and a replay's event names the
    batches it supersedes."""
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    ours = {e["run"]["facets"]["microbatch_batch"]["batchId"]: e for e in events
            if e["job"]["name"] == "microbatch.ip_count"}
    with transaction(url) as session:
        committed = dict(session.execute(text("SELECT id, kind FROM batches WHERE state = 'committed'")).all())
        ranges = session.execute(text("SELECT batch_id, partition, start_offset, end_offset FROM ranges "
                                      "ORDER BY batch_id, partition, start_offset")).all()
    assert set(ours) == set(committed), (sorted(ours), sorted(committed))
    for batch_id, event in ours.items():
        [source] = event["inputs"]
        facet = [(r["partition"], r["start"], r["end"]) for r in source["inputFacets"]["microbatch_offsetRanges"]
                 ["ranges"]]
        assert facet == [tuple(r[1:]) for r in ranges if r[0] == batch_id], batch_id
        batch = event["run"]["facets"]["microbatch_batch"]
        assert batch["kind"] == committed[batch_id]
        assert batch["supersedes"] == sorted(old for old, by, _ in superseded if by == batch_id)
    assert sum(1 for e in ours.values() if e["run"]["facets"]["microbatch_batch"]["supersedes"]) == len(
        {by for _, by, _ in superseded})


def test_replay_one_partition_after_a_transform_change(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=800, bootstrap=kafka.bootstrap_servers)
    lineage_file = tmp_path / "openlineage.jsonl"  # Airflow's OpenLineage provider, with its file transport
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
        {"type": "file", "log_file_path": str(lineage_file), "append": True})}
    lines = generate_lines(2_400, ips=12, span_seconds=40, malformed=0.03, seed=51,
                           start=datetime(2026, 11, 22, 13, 0, 0, tzinfo=UTC))
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)
    first = run_pipeline(env)
    assert first.returncode == 0, first.stdout[-3000:]
    before = assert_exactly_once(ledger_url, env, lines, coords)
    sink_before, late_before, dead_before = sink_counts(ledger_url), late_coordinates(ledger_url), \
        dead_letter_coordinates(ledger_url)
    cursor = positions(ledger_url)

    # Records that arrive after the run are never committed: replaying them is refused, nothing written.
    extra = generate_lines(100, ips=12, span_seconds=5, malformed=0.0, seed=52,
                           start=datetime(2026, 11, 22, 13, 1, 0, tzinfo=UTC))
    produce_lines(kafka.bootstrap_servers, topic, extra)
    batches = batch_count(ledger_url)
    refused = cli(env, "backfill", "ip_count", "--topic", topic, "--mode", "replay", "--partitions", "0",
                  "--start", str(cursor[0]), "--end", "latest")
    assert refused.returncode != 0
    assert "was never committed, so there is nothing to replay" in refused.stdout + refused.stderr
    assert batch_count(ledger_url) == batches

    # The transform changes: one client is left out of the counts from now on.
    by_partition = Counter(ip for (partition, _), line in zip(coords, lines, strict=True)
                           if partition == 0 and not line.malformed for ip in [line.ip])
    excluded = by_partition.most_common(1)[0][0]
    spec_path = specs / "ip_count.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["job"].setdefault("options", {})["exclude_ips"] = [excluded]
    spec_path.write_text(yaml.safe_dump(spec))

    ranges = partition_ranges(ledger_url, 0)
    assert len(ranges) >= 3, ranges
    (b1, s1, e1), (b2, s2, e2) = ranges[0], ranges[1]
    request = ("--start", str(s1 + 1), "--end", str(e2 - 1))
    dry = cli(env, "backfill", "ip_count", "--topic", topic, "--mode", "replay", "--partitions", "0", *request,
              "--dry-run")
    dry_log = dry.stdout + dry.stderr
    assert dry.returncode == 0, dry_log[-3000:]
    assert f"widened {topic}[0] [{s1 + 1}, {e2 - 1}) to whole committed batches: {topic}[0] [{s1}, {e2})" in dry_log
    assert plan_lines(dry_log) == sorted([
        f"{topic}[0] [{s1}, {e1}): {e1 - s1} records, replacing the contribution of batch {b1}",
        f"{topic}[0] [{s2}, {e2}): {e2 - s2} records, replacing the contribution of batch {b2}",
    ])
    assert batch_count(ledger_url) == batches, "a dry run writes nothing"

    done = cli(env, "backfill", "ip_count", "--topic", topic, "--mode", "replay", "--partitions", "0", *request)
    done_log = run_log(done)
    assert done.returncode == 0, done_log[-4000:]
    assert plan_lines(done_log) == plan_lines(dry_log), "the dry run announced what the run did"

    # Independent recomputation: the old totals minus the excluded client's good, on-time records in
    # the replayed ranges (the replay starts from each original batch's state, so lateness is the same).
    replayed = {(0, offset) for offset in [*range(s1, e1), *range(s2, e2)]}
    removed = Counter()
    for coord, line in zip(coords, lines, strict=True):
        if coord in replayed and not line.malformed and line.ip == excluded and coord not in late_before:
            epoch = int(line.event_time.timestamp())
            removed[(datetime.fromtimestamp(epoch - epoch % 5, tz=UTC), line.ip)] += 1
    assert removed, "the excluded client must have records in the replayed ranges"
    expected = sink_before - removed  # Counter subtraction drops keys that reach zero, as the sink does
    after = sink_counts(ledger_url)
    assert after == expected
    assert any(ip == excluded for _, ip in after), "the client's records outside the replayed ranges still count"
    assert late_coordinates(ledger_url) == late_before
    assert dead_letter_coordinates(ledger_url) == dead_before
    assert positions(ledger_url) == cursor, "a replay never moves the scheduled cursor"

    with transaction(ledger_url) as session:
        superseded = session.execute(text(
            "SELECT r.batch_id, r.superseded_by, b.kind FROM ranges r JOIN batches b ON b.id = r.superseded_by "
            "WHERE r.superseded_by IS NOT NULL ORDER BY r.batch_id")).all()
    assert [(row[0], row[2]) for row in superseded] == [(b1, "replay"), (b2, "replay")]
    assert [r[1:] for r in partition_ranges(ledger_url, 0)][:2] == [(s1, e1), (s2, e2)]
    history = json.loads(cli(env, "history", "ip_count", "--json").stdout)
    shown = {row["id"]: row["ranges"] for row in history}
    assert (0, s1, e1, superseded[0][1]) in {(r["partition"], r["start"], r["end"], r["superseded_by"])
                                             for r in shown[b1]}
    assert {row["kind"] for row in history if row["id"] > b2} >= {"replay"}
    audit = cli(env, "verify", "ip_count")
    assert audit.returncode == 0, audit.stdout
    check_lineage(ledger_url, lineage_file, superseded)

    # Final windows whose count changed are published again as corrections, with the new count.
    published = read_output(kafka.bootstrap_servers, f"{topic}_out")
    corrections = {(datetime.fromisoformat(v["window_start"]).astimezone(UTC), v["ip"]): v["count"]
                   for _, v in published if v.get("correction")}
    changed_final = {key for key in removed if key[0] + timedelta(seconds=5) <= before.watermark}
    assert set(corrections) == changed_final
    assert all(count == expected.get(key, 0) for key, count in corrections.items())
