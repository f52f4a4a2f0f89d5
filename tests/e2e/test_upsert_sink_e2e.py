"""`postgres_upsert` end to end on real Kafka, Postgres, Spark and Airflow (`dag.test()`): each user's last page
(the greatest (ts, topic, partition, offset) among the committed clicks, late ones included), with
`{"forget": true}` clicks as tombstones that remove the user; through a stage driver killed after staging and
a commit killed inside its open transaction; then a replay of a past range, after the table was tampered
with, must leave it exactly as the history processed once in order, including users the range touches whose
winner came from another batch. The oracle replays the produced records in order, tombstones included."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import produce_lines
from microbatch.ledger.database import get_engine, transaction
from tests.e2e.helpers import cli, dead_letter_coordinates, positions
from tests.e2e.test_append_sink_e2e import MALFORMED, PIPELINE, T0, Click, click, dag_folder, run

pytestmark = pytest.mark.e2e


def forget(user: str, when: datetime) -> Click:
    when = when.replace(microsecond=0)
    payload = {"user": user, "forget": True, "ts": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return Click(json.dumps(payload).encode(), None, when, user)


def generate(seed: int) -> list[Click]:
    """Clicks of 30 users over 5 minutes, some of them tombstones, some malformed, then late clicks."""
    rng = random.Random(seed)
    out: list[Click] = []
    for i in range(1_200):
        when = T0 + timedelta(seconds=i / 4)
        roll = rng.random()
        if roll < 0.03:
            out.append(Click(rng.choice(MALFORMED), None, None))
        elif roll < 0.08:
            out.append(forget(f"u{rng.randrange(30)}", when))
        else:
            out.append(click(f"u{rng.randrange(30)}", f"/p{rng.randrange(8)}", when))
    out += [click(f"u{rng.randrange(30)}", "/late", T0 + timedelta(seconds=rng.randrange(50))) for _ in range(40)]
    return out


def write_spec(directory: Path, topic: str) -> Path:
    spec = {
        "name": PIPELINE,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 400, "commit_group_offsets": False},
        "job": {"transform": "spark_jobs.clicks:transform",
                "options": {"window_seconds": 60, "allowed_lateness_seconds": 5}},
        "sinks": [{"name": "user_last_page", "type": "postgres_upsert", "table": "user_last_page",
                   "columns": {"user": "text", "page": "text", "ts": "timestamptz"}, "keys": ["user"],
                   "order_by": "ts", "delete_column": "forget"}],
        "retries": {"count": 3, "delay_seconds": 1, "backoff": 1},
        "spark": {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "2"}},  # the suite's Connect server
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def oracle(clicks: list[Click], coords: list[tuple[int, int]]) -> dict[str, tuple]:
    """Replay every valid record in the sink's order, (ts, partition, offset); a tombstone removes the user."""
    table: dict[str, tuple] = {}
    ordered = sorted(((c.event_time, p, o, c) for (p, o), c in zip(coords, clicks, strict=True) if not c.malformed),
                     key=lambda item: item[:3])
    for when, partition, offset, c in ordered:
        if c.ip is None:  # {"forget": true}
            table.pop(c.user, None)
        else:
            table[c.user] = (c.ip, when, partition, offset)
    return table


def table_rows(url: str) -> dict[str, tuple]:
    with transaction(url) as session:
        rows = session.execute(text('SELECT "user", page, ts, partition, "offset" FROM user_last_page')).all()
    return {user: (page, ts, partition, offset) for user, page, ts, partition, offset in rows}


def check(url: str, env: dict[str, str], clicks: list[Click], coords: list[tuple[int, int]]) -> None:
    assert table_rows(url) == oracle(clicks, coords)
    assert dead_letter_coordinates(url) == sorted(co for co, c in zip(coords, clicks, strict=True) if c.malformed)
    audit = cli(env, "verify", PIPELINE)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_upsert_sink_keeps_the_last_value_then_replay(service_env, topic, kafka, ledger_url,
                                                                      tmp_path):
    specs = write_spec(tmp_path / "pipelines", topic)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **dag_folder(tmp_path)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with get_engine(ledger_url).connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert {"user_last_page", "user_last_page_versions", "stage_user_last_page"} <= tables
    clicks = generate(seed=19)
    coords = produce_lines(kafka.bootstrap_servers, topic, clicks)
    assert any(c.ip is None and not c.malformed for c in clicks) and oracle(clicks, coords)

    # The crashes of this path are test_row_sinks_crash_points.py's; here: the run, then a replay.
    done = run(env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check(ledger_url, env, clicks, coords)

    with transaction(ledger_url) as session:
        ranges = session.execute(text(
            "SELECT start_offset, end_offset FROM ranges WHERE committed AND partition = 0 "
            "ORDER BY start_offset")).all()
    assert len(ranges) >= 2, ranges
    (s1, _), (_, e2) = ranges[-2], ranges[-1]  # the last two: where some users' winners are
    # Users whose winner lies in the replayed range and users whose winner is elsewhere both exist.
    replayed_users = sorted({c.user for (p, o), c in zip(coords, clicks, strict=True)
                             if p == 0 and s1 <= o < e2 and not c.malformed})
    winners = oracle(clicks, coords)
    assert any(w[2] == 0 and s1 <= w[3] < e2 for w in winners.values())
    assert any(u in replayed_users and not (w[2] == 0 and s1 <= w[3] < e2) for u, w in winners.items())
    # Someone tampers with the rows of those users: the replay rebuilds every key its ranges touch.
    with transaction(ledger_url) as session:
        session.execute(text("UPDATE user_last_page SET page = 'tampered' WHERE \"user\" = ANY(:u)"),
                        {"u": replayed_users})
        session.execute(text("DELETE FROM user_last_page WHERE \"user\" = :u"),
                        {"u": next(u for u in replayed_users if u in winners)})
    cursor = positions(ledger_url)
    done = cli(env, "backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--partitions", "0",
               "--start", str(s1), "--end", str(e2))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check(ledger_url, env, clicks, coords)
    assert positions(ledger_url) == cursor, "a replay never moves the scheduled cursor"
