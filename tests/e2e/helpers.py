"""End-to-end helpers: a test copy of the ip_count spec, real DAG runs in a subprocess, and the
independent checks (recount of the input, dead letters, ledger audit)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import text

from microbatch.airflow.runner import MIGRATED_MARKER
from microbatch.dev.datagen import LogLine
from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import transaction

ROOT = Path(__file__).resolve().parents[2]


SHORT_LIVED_DRIVER = {"spark.driver.extraJavaOptions": "-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
"""The JVM options of the suite's spark-submit drivers, each of which lives for one small batch: the C1 compiler
alone and the serial collector, so that no C2 compiler thread or parallel GC takes the 2 cores from the tests beside
it (a test of two such drivers: 84 -> 63 CPU-seconds). The time zone is the one option the stage sets there
(`operators.submit_conf`), which the spec's own setting replaces. The shipped spec keeps the JVM's defaults, and so
does test_ip_count_e2e.py, the spark-submit path as a user's pipeline runs it (`jvm_defaults`)."""


def spark_section(conf: dict[str, str], mode: str, jvm_defaults: bool = False) -> dict:
    """The test spec's `spark` section. `auto` (the shipped default) stages through the suite's Spark Connect server
    (MICROBATCH_SPARK_REMOTE, see tests/conftest.py) with the spec's `spark.sql.*` settings, the only ones a Connect
    session may set; `submit` runs spark-submit per stage (the UI off keeps concurrent drivers off each other's
    ports), for the tests whose subject is spark-submit: a killed driver, cluster mode, SASL, process arguments;
    its driver has `SHORT_LIVED_DRIVER`'s options unless `jvm_defaults`."""
    if mode == "submit":
        return {"mode": "submit", "conf": {**conf, "spark.ui.enabled": "false",
                                           **({} if jvm_defaults else SHORT_LIVED_DRIVER)}}
    return {"mode": mode, "conf": {key: value for key, value in conf.items() if key.startswith("spark.sql.")}}


def write_test_spec(directory: Path, topic: str, max_records: int, retry_delay: float = 1.0,
                    bootstrap: str | None = None, batches_per_run: int = 1, spark_mode: str = "auto",
                    retry_backoff: float = 1.0, jvm_defaults: bool = False) -> Path:
    """A copy of ip_count.yaml that reads `topic`, in small batches (up to `batches_per_run` per run), with short
    retry delays (`retry_delay` s each, `retry_backoff` times the last: 1 s apart, not 1, 2-3 and 4-7 s), and
    publishes to `<topic>_out` (created here when `bootstrap` is given); `spark_mode` and `jvm_defaults` as
    `spark_section` says."""
    spec = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    spec["source"].update(topics=[topic], max_records_per_batch=max_records, commit_group_offsets=False)
    if batches_per_run > 1:
        spec["source"]["max_batches_per_run"] = batches_per_run
    for sink in spec["sinks"]:
        if sink["type"] == "kafka":
            sink["topic"] = f"{topic}_out"
    if bootstrap:
        create_topic(bootstrap, f"{topic}_out", 4)
    spec["retries"] = {"count": 3, "delay_seconds": retry_delay, "backoff": retry_backoff}
    spec["spark"] = spark_section(spec["spark"]["conf"], spark_mode, jvm_defaults)
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


RUN_LOG = re.compile(r"(?:Airflow's task log|full log): (\S+)")
"""Where `microbatch run`, `backfill`, `maintain` and `demo` say their log file is."""


def run_log(output: str | subprocess.CompletedProcess[str]) -> str:
    """What a `microbatch run`, `backfill` or `maintain` printed (stdout, then stderr), followed by the log file it
    named there: the task logs (what was read, staged and committed) never reach the terminal, which shows one line
    per DAG run and a failed run's cause."""
    if isinstance(output, subprocess.CompletedProcess):
        output = output.stdout + output.stderr
    files = [Path(path) for path in dict.fromkeys(RUN_LOG.findall(output))]
    return output + "".join(f"\n{path.read_text(errors='replace')}" for path in files if path.is_file())


def sink_counts(url: str, table: str = "ip_counts") -> Counter:
    with transaction(url) as session:
        rows = session.execute(text(f"SELECT window_start, ip, count FROM {table}")).all()
    return Counter({(start, ip): count for start, ip, count in rows})


def dead_letter_coordinates(url: str) -> list[tuple[int, int]]:
    with transaction(url) as session:
        rows = session.execute(text('SELECT partition, "offset" FROM dead_letters ORDER BY 1, 2')).all()
    return [tuple(row) for row in rows]


def positions(url: str) -> dict[int, int]:
    with transaction(url) as session:
        return dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())


TOPIC_PARTITIONS = 4  # the `topic` fixture's partition count


def expected_positions(coords: list[tuple[int, int]], partitions: int = TOPIC_PARTITIONS) -> dict[int, int]:
    """The next offset of every partition after all `coords` are committed: one past the last record, or 0 for
    a partition that received none (keyed records can miss a partition; the ledger still tracks it)."""
    ends = dict.fromkeys(range(partitions), 0)
    for partition, offset in coords:
        ends[partition] = max(ends[partition], offset + 1)
    return ends


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


def read_topic(bootstrap: str, topic: str, isolation_level: str = "read_committed", **client: Any) -> list:
    """Every record of `topic` as a consumer of `isolation_level` sees it, from the beginning to the end offsets
    (not until an idle timeout); `client`: more of kafka-python's settings (a SASL login)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, group_id=None,
                             enable_auto_commit=False, **client)
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
                        output_topic: str | None = None, table: str = "ip_counts") -> Expected:
    """The sink equals an independent recount, dead letters equal the malformed lines, late records equal
    the records beyond the lateness, the ledger is whole, and (with `output_topic`) every final window
    is published exactly once with its exact count."""
    expected = recount(lines, coords, committed_batches(url))
    actual = sink_counts(url, table)
    assert sum(actual.values()) + len(expected.late) == sum(1 for line in lines if not line.malformed)
    assert actual == expected.counts
    assert late_coordinates(url) == expected.late
    malformed = sorted(coord for coord, line in zip(coords, lines, strict=True) if line.malformed)
    assert dead_letter_coordinates(url) == malformed
    assert positions(url) == expected_positions(coords)
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
    to a file: a pipe nobody reads would fill and stall the run. The log is that output and the run's log file."""
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
    return WatchedRun(run.returncode, run_log(log_path.read_text()), spark_seen, leaked)


# The clicks pipeline (include/pipelines/clicks.yaml, spark_jobs/clicks.py): a test copy of its spec, and the
# oracles of its four row sinks, computed from the produced records alone. A record is any object with `value`
# (the JSON bytes produced), `event_time` and `malformed`, as microbatch.dev.datagen.Click and the e2e tests'
# own click records are; user, page and forget are read back from the JSON.


ROW_SINK_TYPES = ("postgres_append", "postgres_aggregate", "postgres_upsert", "kafka")


def write_clicks_test_spec(directory: Path, topic: str, max_records: int, *, out_topic: str | None = None,
                           transaction_size: int = 500, retries: int = 3, retry_delay: float = 1.0,
                           bootstrap: str | None = None, partitions: int = 4,
                           sink_types: tuple[str, ...] = ROW_SINK_TYPES, spark_mode: str = "auto",
                           retry_backoff: float = 1.0) -> Path:
    """A copy of the shipped clicks.yaml that reads `topic` in batches of `max_records`, has no schedule,
    short retry delays (as `write_test_spec`'s), and publishes clicks_raw to `out_topic` (default `<topic>_out`,
    created here when `bootstrap` is given) in transactions of `transaction_size`. It keeps the shipped sinks of
    `sink_types` only (by default the row sinks, whose oracles are below); `spark_mode` as `spark_section` says."""
    spec = yaml.safe_load((ROOT / "include/pipelines/clicks.yaml").read_text())
    spec["schedule"] = None
    spec["sinks"] = [sink for sink in spec["sinks"] if sink["type"] in sink_types]
    assert {sink["type"] for sink in spec["sinks"]} == set(sink_types), "clicks.yaml lost a sink type"
    spec["source"].update(topics=[topic], max_records_per_batch=max_records, commit_group_offsets=False)
    out_topic = out_topic or f"{topic}_out"
    for sink in spec["sinks"]:
        if sink["type"] == "kafka":
            sink.update(topic=out_topic, transaction_size=transaction_size)
    if bootstrap:
        create_topic(bootstrap, out_topic, partitions)
    spec["retries"] = {"count": retries, "delay_seconds": retry_delay, "backoff": retry_backoff}
    spec["spark"] = spark_section({**spec["spark"]["conf"], "spark.sql.shuffle.partitions": "2"}, spark_mode)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "clicks.yaml").write_text(yaml.safe_dump(spec))
    return directory


_MIGRATED_DB: list[Path] = []


def migrated_airflow_home(home: Path) -> Path:
    """A new Airflow home holding a copy of a metadata DB that `airflow db migrate` made once per test session
    (marked migrated, as `microbatch.airflow.runner.metadata_db` marks the homes it migrates), instead of ~14 s of
    migrations per home. The shipped path, migrating a fresh home, is the session's own home's and `make demo`'s."""
    if not _MIGRATED_DB:
        template = Path(tempfile.mkdtemp(prefix="microbatch-airflow-template-"))
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                       env={**os.environ, "AIRFLOW_HOME": str(template)}, stdout=subprocess.DEVNULL, timeout=300)
        _MIGRATED_DB.append(template / "airflow.db")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MIGRATED_DB[0], home / "airflow.db")
    (home / MIGRATED_MARKER).touch()
    return home


def pipeline_dag_folder(directory: Path, pipeline: str) -> dict[str, str]:
    """A DAG folder holding only `pipeline`'s thin DAG file, and an Airflow home of its own: the shipped dags/
    would also load the DAGs of pipelines whose specs the test's pipelines folder lacks."""
    dags, home = directory / "dags", migrated_airflow_home(directory / "airflow")
    dags.mkdir(parents=True, exist_ok=True)
    (dags / f"{pipeline}.py").write_text(
        "from microbatch.airflow.dags import backfill_dag, pipeline_dag\n\n"
        f"dag = pipeline_dag({pipeline!r})\nbackfill = backfill_dag({pipeline!r})\n")
    return {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW_HOME": str(home)}


@dataclass(frozen=True)
class ClickFacts:
    """What a valid click record says: its user, page (None for a forget) and whether it forgets the user."""

    user: str
    page: str | None
    forget: bool
    ts: datetime


def click_facts(record) -> ClickFacts | None:
    """The facts of a produced click, or None for a malformed one (a dead letter)."""
    if record.malformed:
        return None
    payload = json.loads(record.value)
    return ClickFacts(payload["user"], payload.get("page"), bool(payload.get("forget")), record.event_time)


def expected_clicks_raw(records: list, coords: list[tuple[int, int]]) -> dict[tuple[int, int], tuple]:
    """clicks_raw: every valid click once (late ones and forgets too), by its (partition, offset)."""
    out = {}
    for coord, record in zip(coords, records, strict=True):
        facts = click_facts(record)
        if facts is not None:
            out[coord] = (facts.user, facts.page, facts.ts)
    return out


@dataclass(frozen=True)
class _PageLine:
    """A click as helpers.recount counts it: `ip` is the page (None for a forget, which counts no view)."""

    ip: str | None
    event_time: datetime | None
    malformed: bool


def recount_page_views(records: list, coords: list[tuple[int, int]],
                       batches: list[tuple[str, list[tuple[int, int, int]]]], window: int = 60,
                       lateness: int = 5) -> Expected:
    """page_views and late_records: the watermark rule of `recount` over the committed batches (a forget moves
    the watermark and can be late, as any valid click, but is no page view)."""
    lines = []
    for record in records:
        facts = click_facts(record)
        lines.append(_PageLine(None, None, True) if facts is None else
                     _PageLine(None if facts.forget else facts.page, facts.ts, False))
    expected = recount(lines, coords, batches, window=window, lateness=lateness)
    expected.counts = Counter({key: n for key, n in expected.counts.items() if key[1] is not None})
    return expected


def expected_user_last_page(records: list, coords: list[tuple[int, int]]) -> dict[str, tuple]:
    """user_last_page: every valid click (late ones included) replayed in the sink's order, (ts, partition,
    offset); a forget removes its user. {user: (page, ts, partition, offset)}."""
    table: dict[str, tuple] = {}
    ordered = sorted((facts.ts, partition, offset, facts) for (partition, offset), facts in
                     ((coord, click_facts(r)) for coord, r in zip(coords, records, strict=True)) if facts)
    for ts, partition, offset, facts in ordered:
        if facts.forget:
            table.pop(facts.user, None)
        else:
            table[facts.user] = (facts.page, ts, partition, offset)
    return table


def clicks_raw_table(url: str) -> dict[tuple[int, int], tuple]:
    """clicks_raw as {(partition, offset): (user, page, ts)}; a second row for one coordinate fails."""
    with transaction(url) as session:
        rows = session.execute(text('SELECT partition, "offset", "user", page, ts FROM clicks_raw')).all()
    table = {(p, o): (user, page, ts) for p, o, user, page, ts in rows}
    assert len(table) == len(rows), "clicks_raw holds a coordinate twice"
    return table


def page_views_table(url: str) -> Counter:
    with transaction(url) as session:
        rows = session.execute(text("SELECT window_start, page, views FROM page_views")).all()
    return Counter({(start, page): views for start, page, views in rows})


def user_last_page_table(url: str) -> dict[str, tuple]:
    with transaction(url) as session:
        rows = session.execute(text('SELECT "user", page, ts, partition, "offset" FROM user_last_page')).all()
    return {user: (page, ts, partition, offset) for user, page, ts, partition, offset in rows}


def published_clicks_problems(published: list[tuple[int, dict]], raw: dict[tuple[int, int], tuple]) -> list[str]:
    """What is wrong with the clicks_raw rows a read_committed reader saw ((seq, value) as read_output gives):
    the sequences must be 1..n, each valid click published exactly once with its user, page and time, and no
    correction (nothing was replayed). Empty when all is well."""
    problems = []
    seqs = sorted(seq for seq, _ in published)
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"sequences not gap-free and unique: {len(seqs)} records, max {max(seqs, default=0)}")
    sent = Counter((v["partition"], v["offset"]) for _, v in published)
    twice = sorted(co for co, n in sent.items() if n > 1)
    if twice:
        problems.append(f"{len(twice)} click(s) published more than once, e.g. {twice[:3]}")
    missing = sorted(set(raw) - set(sent))
    if missing:
        problems.append(f"{len(missing)} click(s) never published, e.g. {missing[:3]}")
    extra = sorted(set(sent) - set(raw))
    if extra:
        problems.append(f"{len(extra)} published record(s) that are no valid click, e.g. {extra[:3]}")
    wrong = [(v["partition"], v["offset"]) for _, v in published if (v["partition"], v["offset"]) in raw and (
        (v["user"], v["page"], datetime.fromisoformat(v["ts"])) != raw[(v["partition"], v["offset"])]
        or v.get("correction"))]
    if wrong:
        problems.append(f"{len(wrong)} published value(s) differ from the click, e.g. {wrong[:3]}")
    return problems
