"""End-to-end helpers: a test copy of the ip_count spec, real DAG runs in a subprocess, and the
independent checks (recount of the input, dead letters, ledger audit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from sqlalchemy import text

from microbatch.dev.datagen import LogLine
from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import transaction

ROOT = Path(__file__).resolve().parents[2]


def write_test_spec(directory: Path, topic: str, max_records: int, retry_delay: float = 1.0,
                    bootstrap: str | None = None) -> Path:
    """A copy of ip_count.yaml that reads `topic`, in small batches, with short retry delays, and
    publishes to `<topic>_out` (created here when `bootstrap` is given)."""
    spec = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    spec["source"].update(topics=[topic], max_records_per_batch=max_records, commit_group_offsets=False)
    for sink in spec["sinks"]:
        if sink["type"] == "kafka":
            sink["topic"] = f"{topic}_out"
    if bootstrap:
        create_topic(bootstrap, f"{topic}_out", 4)
    spec["retries"] = {"count": 3, "delay_seconds": retry_delay}
    spec["spark"]["conf"] = {**spec["spark"]["conf"], "spark.ui.enabled": "false"}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ip_count.yaml"
    path.write_text(yaml.safe_dump(spec))
    return directory


def run_pipeline(env: dict[str, str], *, max_runs: int = 10, extra_env: dict[str, str] | None = None,
                 timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`microbatch run ip_count` in its own process: a crash failpoint kills only that process."""
    full_env = {**os.environ, **env, **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "run", "ip_count", "--max-runs", str(max_runs)],
        env=full_env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def sink_counts(url: str) -> Counter:
    with transaction(url) as session:
        rows = session.execute(text("SELECT window_start, ip, count FROM ip_counts")).all()
    return Counter({(start, ip): count for start, ip, count in rows})


def dead_letter_coordinates(url: str) -> list[tuple[int, int]]:
    with transaction(url) as session:
        rows = session.execute(text('SELECT partition, "offset" FROM dead_letters ORDER BY 1, 2')).all()
    return [tuple(row) for row in rows]


def positions(url: str) -> dict[int, int]:
    with transaction(url) as session:
        return dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `microbatch ARGS...` as an operator would."""
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120, check=False)


def verify_ledger(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "verify", "ip_count", "--json"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False,
    )
    return json.loads(result.stdout)


def committed_batches(url: str, with_topic: bool = False) -> list[tuple[str, list[tuple]]]:
    """The committed batches in commit order, each as (kind, its (partition, start, end) ranges), or
    (topic, partition, start, end) ranges `with_topic`."""
    with transaction(url) as session:
        rows = session.execute(text(
            "SELECT b.id, b.kind, r.topic, r.partition, r.start_offset, r.end_offset FROM ranges r "
            "JOIN batches b ON b.id = r.batch_id WHERE r.committed "
            "ORDER BY b.committed_at, b.id, r.topic, r.partition"
        )).all()
    batches: dict[int, tuple[str, list[tuple]]] = {}
    for batch_id, kind, topic, partition, start, end in rows:
        batches.setdefault(batch_id, (kind, []))[1].append(
            (topic, partition, start, end) if with_topic else (partition, start, end))
    return list(batches.values())


@dataclass
class Expected:
    counts: Counter
    late: set
    watermark: datetime | None


def recount(lines: list[LogLine], coords: list[tuple[int, int]],
            batches: list[tuple[str, list[tuple[int, int, int]]]], window: int = 5, lateness: int = 5) -> Expected:
    """An independent recount of the input, replaying Flink's watermark rule over the committed batches:
    a record whose window ended at or before the watermark at its batch's start is late. Backfill
    batches are history: nothing in them is late, and they do not move the watermark."""
    by_coord = dict(zip(coords, lines, strict=True))
    counts: Counter = Counter()
    late: set = set()
    max_event: datetime | None = None
    watermark: datetime | None = None
    for kind, ranges in batches:
        backfill = kind == "backfill"
        batch_max = None
        for *source, start, end in ranges:  # (partition, ...) or (topic, partition, ...), as `coords`
            for offset in range(start, end):
                line = by_coord.get((*source, offset))
                if line is None or line.malformed:  # a transaction marker or an aborted record: no data
                    continue
                epoch = int(line.event_time.timestamp())
                window_start = datetime.fromtimestamp(epoch - epoch % window, tz=UTC)
                if not backfill and watermark is not None and window_start + timedelta(seconds=window) <= watermark:
                    late.add((*source, offset))
                    continue
                counts[(window_start, line.ip)] += 1
                batch_max = line.event_time if batch_max is None else max(batch_max, line.event_time)
        if batch_max is not None and not backfill:
            max_event = batch_max if max_event is None else max(max_event, batch_max)
            candidate = max_event - timedelta(seconds=lateness)
            watermark = candidate if watermark is None else max(watermark, candidate)
    return Expected(counts, late, watermark)


def late_coordinates(url: str) -> set[tuple[int, int]]:
    with transaction(url) as session:
        return {tuple(r) for r in session.execute(text('SELECT partition, "offset" FROM late_records')).all()}


def read_topic(bootstrap: str, topic: str) -> list:
    """Every record of `topic` as a read_committed consumer sees it, from the beginning to the end offsets."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None,
                             enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(records)
        return out
    finally:
        consumer.close()


def read_output(bootstrap: str, topic: str) -> list[tuple[int, dict]]:
    """Every record of the output topic as a read_committed consumer sees it: (seq header, value)."""
    return [(int(dict(record.headers)["microbatch.seq"].decode()), json.loads(record.value))
            for record in read_topic(bootstrap, topic)]


def assert_exactly_once(url: str, env: dict[str, str], lines: list[LogLine], coords: list[tuple[int, int]],
                        output_topic: str | None = None) -> Expected:
    """The sink equals an independent recount, dead letters equal the malformed lines, late records equal
    the records beyond the lateness, the ledger is whole, and (with `output_topic`) every final window
    is published exactly once with its exact count."""
    expected = recount(lines, coords, committed_batches(url))
    actual = sink_counts(url)
    assert sum(actual.values()) + len(expected.late) == sum(1 for line in lines if not line.malformed)
    assert actual == expected.counts
    assert late_coordinates(url) == expected.late
    malformed = sorted(coord for coord, line in zip(coords, lines, strict=True) if line.malformed)
    assert dead_letter_coordinates(url) == malformed
    ends: dict[int, int] = {}
    for partition, offset in coords:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    assert positions(url) == ends
    audit = verify_ledger(env)
    assert audit["ok"], audit["problems"]
    if output_topic:
        published = read_output(env["MICROBATCH_KAFKA_BOOTSTRAP"], output_topic)
        seqs = sorted(seq for seq, _ in published)
        assert seqs == list(range(1, len(seqs) + 1)), "sequences must be gap-free and unique"
        windows = Counter((v["window_start"], v["ip"]) for _, v in published)
        assert all(n == 1 for n in windows.values()), "a window was published twice"
        final = {
            (start.isoformat(), ip): n for (start, ip), n in expected.counts.items()
            if start + timedelta(seconds=5) <= expected.watermark
        }
        got = {(datetime.fromisoformat(v["window_start"]).astimezone(UTC).isoformat(), v["ip"]): v["count"]
               for _, v in published}
        assert got == final
    return expected


def _cmdlines() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return out


@dataclass
class WatchedRun:
    returncode: int
    log: str
    spark_seen: bool
    leaked: list[str]


def run_watching_arguments(env: dict[str, str], secrets: list[str], log_path: Path, max_runs: int = 3,
                           timeout: float = 900) -> WatchedRun:
    """`microbatch run ip_count` while polling every process's arguments for `secrets`. The output goes
    to a file: a pipe nobody reads would fill and stall the run."""
    deadline = time.monotonic() + timeout
    with log_path.open("w") as out:
        run = subprocess.Popen([sys.executable, "-m", "microbatch.cli", "run", "ip_count", "--max-runs",
                                str(max_runs)], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
        leaked: list[str] = []
        spark_seen = False
        while run.poll() is None:
            if time.monotonic() > deadline:
                run.kill()
                raise TimeoutError(f"the run took over {timeout:.0f}s; see {log_path}")
            lines = _cmdlines()
            spark_seen |= any("spark_jobs/run_batch.py" in line for line in lines)
            leaked += [line[:200] for line in lines for secret in secrets if secret in line]
            time.sleep(0.2)
    return WatchedRun(run.returncode, log_path.read_text(), spark_seen, leaked)
