"""`postgres_append` end to end on real Kafka, Postgres, Spark and Airflow (`dag.test()`): JSON clicks, some
malformed and some late, land in `clicks_raw` exactly once each with their source coordinates, late ones
included, while the windowed `page_views` aggregate of the same pipeline sends the late ones to
`late_records`; through a stage driver killed after staging and a commit task killed inside its open
transaction; then a replay of a past range rewrites exactly that range's rows (tampered with in between),
in the commit's one transaction. A kafka sink publishes `clicks_raw`: a read_committed reader sees each row
once, and nothing more after the replay, which recomputed the same rows (only changes are published again).
Every check is against an oracle computed here from the produced records."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import produce_lines
from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import get_engine, transaction
from tests.e2e.helpers import (
    Expected,
    cli,
    committed_batches,
    dead_letter_coordinates,
    expected_positions,
    late_coordinates,
    migrated_airflow_home,
    positions,
    read_output,
)
from tests.e2e.helpers import recount as recount_windows

pytestmark = pytest.mark.e2e

PIPELINE = "clicks"
WINDOW, LATENESS = 60, 5
T0 = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Click:
    """One produced record; `ip` is the Kafka key (and the page, for the windowed recount of helpers.recount)."""

    value: bytes
    ip: str | None
    event_time: datetime | None
    user: str | None = None

    @property
    def malformed(self) -> bool:
        return self.event_time is None


def click(user: str, page: str, when: datetime) -> Click:
    when = when.replace(microsecond=0)  # the JSON carries whole seconds
    payload = {"user": user, "page": page, "ts": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return Click(json.dumps(payload).encode(), page, when, user)


MALFORMED = [b"{not json", b'{"user": "u1", "page": "/a"}', b'{"user": "u1", "page": "/a", "ts": "yesterday"}',
             b"[1, 2, 3]", b'{"user": 5, "page": null, "ts": "2026-11-25T10:00:00Z"}']


def generate_clicks(seed: int) -> tuple[list[Click], list[Click]]:
    """On-time clicks over 5 minutes with 3% malformed ones, then clicks of the first minute (late by then)."""
    rng = random.Random(seed)
    pages = [f"/p{i}" for i in range(8)]
    first = []
    for i in range(1_200):
        if rng.random() < 0.03:
            first.append(Click(rng.choice(MALFORMED), None, None))
        else:
            first.append(click(f"u{rng.randrange(40)}", rng.choice(pages), T0 + timedelta(seconds=i / 4)))
    late = [click(f"u{rng.randrange(40)}", rng.choice(pages), T0 + timedelta(seconds=rng.randrange(50)))
            for _ in range(60)]
    return first, late


def write_spec(directory: Path, topic: str, out_topic: str) -> Path:
    spec = {
        "name": PIPELINE,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 400, "commit_group_offsets": False},
        "job": {"transform": "spark_jobs.clicks:transform",
                "options": {"window_seconds": WINDOW, "allowed_lateness_seconds": LATENESS}},
        "sinks": [
            {"name": "clicks_raw", "type": "postgres_append", "table": "clicks_raw",
             "columns": {"user": "text", "page": "text", "ts": "timestamptz"}},
            {"name": "page_views", "type": "postgres_aggregate", "table": "page_views",
             "columns": {"window_start": "timestamptz", "window_end": "timestamptz", "page": "text",
                         "views": "bigint"},
             "keys": ["window_start", "window_end", "page"], "sum_columns": ["views"],
             "window": {"start": "window_start", "end": "window_end"}},
            {"name": "clicks_out", "type": "kafka", "topic": out_topic, "source": "clicks_raw", "key": "page"},
        ],
        "retries": {"count": 3, "delay_seconds": 1, "backoff": 1},
        "spark": {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "2"}},  # the suite's Connect server
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def create_sink_tables(env: dict[str, str], url: str) -> None:
    """The sink tables from the spec, by `microbatch migrate` as an operator makes them."""
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with get_engine(url).connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert {"clicks_raw", "stage_clicks_raw", "page_views", "stage_page_views", "page_views_contributions"} <= tables
    pkey = sa.inspect(get_engine(url)).get_pk_constraint("clicks_raw")["constrained_columns"]
    assert pkey == ["topic", "partition", "offset"]


def dag_folder(tmp_path: Path) -> dict[str, str]:
    """A DAG folder holding only this pipeline's thin DAG file, and an Airflow home of its own, so the
    shared session's DAGs (dags/ip_count.py reads a spec this test's pipelines folder lacks) stay apart."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{PIPELINE}.py").write_text(
        "from microbatch.airflow.dags import backfill_dag, pipeline_dag\n\n"
        f"dag = pipeline_dag({PIPELINE!r})\nbackfill = backfill_dag({PIPELINE!r})\n")
    home = migrated_airflow_home(tmp_path / "airflow")
    return {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW_HOME": str(home)}


def run(env: dict[str, str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`microbatch run clicks` in its own process until caught up: a crash failpoint kills only that process."""
    return subprocess.run([sys.executable, "-m", "microbatch.cli", "run", PIPELINE, "--max-runs", "12"],
                          env={**os.environ, **env, **(extra_env or {})}, capture_output=True, text=True,
                          timeout=900, check=False)


def raw_rows(url: str) -> dict[tuple[int, int], tuple[str, str, datetime]]:
    with transaction(url) as session:
        rows = session.execute(text('SELECT partition, "offset", "user", page, ts, topic FROM clicks_raw')).all()
    table = {(p, o): (u, page, ts) for p, o, u, page, ts, _ in rows}
    assert len(table) == len(rows)
    return table


def page_views(url: str) -> dict[tuple[datetime, str], int]:
    with transaction(url) as session:
        return {(s, p): n for s, p, n in session.execute(text("SELECT window_start, page, views FROM page_views"))}


def check_exactly_once(url: str, env: dict[str, str], clicks: list[Click], coords: list[tuple[int, int]],
                       expected: Expected | None = None) -> Expected:
    """clicks_raw holds every valid click once (late ones too) with its coordinates; page_views and
    late_records follow the watermark over the committed batches (or `expected`, after a replay, which
    recounts its ranges from their original state); dead letters are the malformed clicks; the ledger is
    whole. Returns the expected windows and late clicks."""
    valid = {coord: (c.user, c.ip, c.event_time) for coord, c in zip(coords, clicks, strict=True) if not c.malformed}
    assert raw_rows(url) == valid
    if expected is None:
        expected = recount_windows(clicks, coords, committed_batches(url), window=WINDOW, lateness=LATENESS)
    assert expected.late, "the test must produce late clicks"
    assert late_coordinates(url) == expected.late
    assert expected.late <= set(valid), "late clicks land in the append sink too (include_late)"
    assert page_views(url) == dict(expected.counts)
    assert dead_letter_coordinates(url) == sorted(co for co, c in zip(coords, clicks, strict=True) if c.malformed)
    assert positions(url) == expected_positions(coords)
    audit = cli(env, "verify", PIPELINE)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    with transaction(url) as session:
        assert session.execute(text("SELECT count(*) FROM stage_clicks_raw")).scalar_one() == 0
    return expected


def test_append_sink_exactly_once_then_replay(service_env, topic, kafka, ledger_url, tmp_path):
    out_topic = f"{topic}_out"
    create_topic(kafka.bootstrap_servers, out_topic, 2)
    specs = write_spec(tmp_path / "pipelines", topic, out_topic)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **dag_folder(tmp_path)}
    create_sink_tables(env, ledger_url)
    first, late = generate_clicks(seed=18)
    clicks = first + late
    coords = produce_lines(kafka.bootstrap_servers, topic, first) + produce_lines(kafka.bootstrap_servers, topic, late)

    # The crashes of this path are test_row_sinks_crash_points.py's; here: the run, then a replay.
    done = run(env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = check_exactly_once(ledger_url, env, clicks, coords)

    published = read_output(kafka.bootstrap_servers, out_topic)
    assert sorted(seq for seq, _ in published) == list(range(1, len(published) + 1)), "gap-free, unique"
    valid = {coord: c for coord, c in zip(coords, clicks, strict=True) if not c.malformed}
    sent = [(v["partition"], v["offset"]) for _, v in published]
    assert sorted(sent) == sorted(valid), "each row published exactly once"
    assert all(v["user"] == valid[(v["partition"], v["offset"])].user and not v.get("correction")
               for _, v in published)

    # Replay partition 0's first two committed ranges after someone tampered with their rows: the replay
    # deletes the rows of exactly those ranges and inserts them again; nothing else moves.
    with transaction(ledger_url) as session:
        ranges = session.execute(text(
            "SELECT start_offset, end_offset FROM ranges WHERE committed AND partition = 0 "
            "ORDER BY start_offset")).all()
        assert len(ranges) >= 2, ranges
        (s1, _), (_, e2) = ranges[0], ranges[1]
        session.execute(text('UPDATE clicks_raw SET page = \'tampered\' WHERE partition = 0 AND "offset" < :e'),
                        {"e": e2})
        session.execute(text('DELETE FROM clicks_raw WHERE partition = 0 AND "offset" = :o'),
                        {"o": next(o for p, o in valid if p == 0 and s1 <= o < e2)})
        outside = session.execute(text('SELECT count(*) FROM clicks_raw WHERE partition <> 0 OR "offset" >= :e'),
                                  {"e": e2}).scalar_one()
    cursor = positions(ledger_url)
    done = cli(env, "backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--partitions", "0",
               "--start", str(s1), "--end", str(e2))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check_exactly_once(ledger_url, env, clicks, coords, expected)
    assert positions(ledger_url) == cursor, "a replay never moves the scheduled cursor"
    with transaction(ledger_url) as session:
        superseded = session.execute(text("SELECT count(*) FROM ranges WHERE superseded_by IS NOT NULL")).scalar_one()
        assert superseded == 2
        assert session.execute(text('SELECT count(*) FROM clicks_raw WHERE partition <> 0 OR "offset" >= :e'),
                               {"e": e2}).scalar_one() == outside

    # The replay gave exactly the rows that were published (the tampering was the table's, not the topic's): it
    # publishes nothing, since a replay publishes only rows that changed or disappeared.
    republished = read_output(kafka.bootstrap_servers, out_topic)
    assert republished == published
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM outbox o JOIN batches b ON b.id = o.batch_id "
                                    "WHERE b.kind = 'replay'")).scalar_one() == 0
