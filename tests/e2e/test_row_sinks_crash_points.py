"""Every row sink at once through every failpoint on the path, by os._exit and by SIGKILL, on real Kafka,
Postgres, Spark (the suite's shared Spark Connect server, the shipped default) and Airflow (`dag.test()`).

One clicks pipeline (a test copy of include/pipelines/clicks.yaml) feeds all the row sinks: `clicks_raw`
(postgres_append, late clicks included), `page_views` (postgres_aggregate, late clicks to late_records),
`user_last_page` (postgres_upsert, forgets as tombstones) and `clicks_out` (kafka, the clicks_raw rows,
published in small transactions). All the failpoints are armed at once, each firing once (marker files):

- `stage.read=N` (`=N:kill` for SIGKILL): a Python worker of the Connect server dies mid-read, and Airflow retries
  the stage task in the same run;
- in the runner process itself, which dies and is started again (a Connect stage task is a client in the runner's
  own process): `stage.after_write` and `stage.after_staged`, `commit.before_commit` (transaction open),
  `commit.after_commit` (after COMMIT), `publish.before_commit` (Kafka transaction open), `publish.after_commit`
  (Kafka committed, progress not recorded), `publish.between_transactions`.

`microbatch run` is started again until it exits 0. Then every table, the late records, the dead letters and
the read_committed output topic must equal oracles computed here from the produced records (the upsert oracle
replays the history in order, tombstones included), and the ledger must be whole. The spark-submit driver's deaths
are tests/chaos/test_crash_recovery.py's.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from microbatch.dev.datagen import produce_lines
from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    cli,
    clicks_raw_table,
    committed_batches,
    dead_letter_coordinates,
    expected_clicks_raw,
    expected_positions,
    expected_user_last_page,
    late_coordinates,
    page_views_table,
    pipeline_dag_folder,
    positions,
    published_clicks_problems,
    read_output,
    recount_page_views,
    user_last_page_table,
    write_clicks_test_spec,
)
from tests.e2e.test_append_sink_e2e import MALFORMED, PIPELINE, T0, Click, click, run
from tests.e2e.test_upsert_sink_e2e import forget

pytestmark = pytest.mark.e2e

STAGE_POINTS = ["stage.read"]  # a worker of the Connect server dies: the stage task is retried
RUNNER_POINTS = ["stage.after_write", "stage.after_staged", "commit.before_commit", "commit.after_commit",
                 "publish.before_commit", "publish.after_commit", "publish.between_transactions"]  # each kills the
# runner: one more `microbatch run`
READ_LIMIT = 25  # records a Python worker reads before it dies
TRANSACTION_SIZE = 100  # several Kafka transactions per publish, so that between_transactions is reached
MAX_RECORDS = 500  # two batches: the late clicks are in the second


def generate(seed: int) -> list[Click]:
    """900 clicks of 30 users on 8 pages over 225 s (5% forgets, 3% malformed), then 40 clicks (some forgets)
    of the first 50 s: late by the time they are read, as the first batch has moved the watermark."""
    rng = random.Random(seed)
    out: list[Click] = []
    for i in range(900):
        when = T0 + timedelta(seconds=i / 4)
        roll = rng.random()
        if roll < 0.03:
            out.append(Click(rng.choice(MALFORMED), None, None))
        elif roll < 0.08:
            out.append(forget(f"u{rng.randrange(30)}", when))
        else:
            out.append(click(f"u{rng.randrange(30)}", f"/p{rng.randrange(8)}", when))
    for _ in range(40):
        when = T0 + timedelta(seconds=rng.randrange(50))
        user = f"u{rng.randrange(30)}"
        out.append(forget(user, when) if rng.random() < 0.1 else click(user, "/late", when))
    return out


# Each point dies the other way than in tests/chaos/test_crash_recovery.py (which arms the stage's and the
# commit's points on ip_count): between the two files, every (point, mode) of the matrix runs once. The
# publisher's points: os._exit and SIGKILL of each are also tests/integration/test_publisher.py's.
ARMED = (f"stage.read={READ_LIMIT}:kill,stage.after_write,stage.after_staged=kill,commit.before_commit,"
         "commit.after_commit=kill,publish.before_commit,publish.after_commit=kill,publish.between_transactions=kill")


def death_code(point: str) -> int:
    """The exit code the runner dies with at `point`, by how ARMED arms it."""
    item = next(i for i in ARMED.split(",") if i.split("=")[0] == point)
    return -9 if item.endswith("kill") else EXIT_CODE


def test_row_sinks_exactly_once_through_every_crash_point(service_env, topic, kafka, ledger_url, tmp_path):
    started = time.monotonic()
    out_topic = f"{topic}_out"
    specs = write_clicks_test_spec(tmp_path / "pipelines", topic, MAX_RECORDS, out_topic=out_topic,
                                   transaction_size=TRANSACTION_SIZE, retries=4, bootstrap=kafka.bootstrap_servers)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **pipeline_dag_folder(tmp_path, PIPELINE)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    clicks = generate(seed=20)
    coords = produce_lines(kafka.bootstrap_servers, topic, clicks)

    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: ARMED, FAILPOINT_DIR_ENV: str(markers)}
    deaths: list[int] = []
    for attempt in range(len(RUNNER_POINTS) + 3):
        before = {p.name for p in markers.iterdir()} if markers.exists() else set()
        result = run(env, armed)
        (tmp_path / f"run{attempt}.log").write_text(result.stdout + result.stderr)
        if result.returncode == 0:
            break
        deaths.append(result.returncode)
        new = sorted({p.name for p in markers.iterdir()} - before - set(STAGE_POINTS)) if markers.exists() else []
        assert len(new) == 1, f"run {attempt} exited {result.returncode}, firing {new}:\n{result.stdout[-3000:]}"
        assert result.returncode == death_code(new[0]), \
            f"run {attempt} died at {new[0]} with {result.returncode}:\n{result.stdout[-3000:]}"
    else:
        pytest.fail(f"the pipeline never caught up after {len(deaths)} deaths; logs in {tmp_path}")
    fired = {p.name for p in markers.iterdir()}
    assert fired == set(STAGE_POINTS + RUNNER_POINTS), sorted(fired)
    assert len(deaths) == len(RUNNER_POINTS), deaths  # one death per runner point, none else
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT max(attempt) FROM batches")).scalar_one() >= len(STAGE_POINTS) + 1
        assert session.execute(text("SELECT count(*) FROM batches WHERE state <> 'committed'")).scalar_one() == 0
        for table in ("stage_clicks_raw", "stage_page_views", "stage_user_last_page"):
            assert session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 0, table

    # clicks_raw: every valid click once, late ones and forgets too, with its coordinates.
    raw = expected_clicks_raw(clicks, coords)
    assert clicks_raw_table(ledger_url) == raw
    # page_views and late_records: the watermark over the committed batches, recounted from the clicks.
    batches = committed_batches(ledger_url)
    assert len(batches) >= 2, batches
    expected = recount_page_views(clicks, coords, batches)
    assert expected.late, "the test must produce late clicks"
    assert late_coordinates(ledger_url) == expected.late
    assert page_views_table(ledger_url) == expected.counts
    # user_last_page: the history replayed in order, tombstones included.
    winners = expected_user_last_page(clicks, coords)
    assert winners and len(winners) < 30, "some users must be forgotten at the end"
    assert user_last_page_table(ledger_url) == winners
    # Dead letters, positions, the ledger audit.
    assert dead_letter_coordinates(ledger_url) == sorted(co for co, c in zip(coords, clicks, strict=True)
                                                         if c.malformed)
    assert positions(ledger_url) == expected_positions(coords)
    audit = cli(env, "verify", PIPELINE)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    # The topic, as a read_committed reader sees it: each clicks_raw row once, in gap-free sequence.
    published = read_output(kafka.bootstrap_servers, out_topic)
    assert not published_clicks_problems(published, raw), published_clicks_problems(published, raw)
    assert len(published) > 2 * TRANSACTION_SIZE
    print(f"{len(clicks)} clicks, {len(raw)} rows, {sum(expected.counts.values())} views, "
          f"{len(expected.late)} late, {len(winners)} users, {len(published)} published, {len(batches)} batches, "
          f"{len(deaths)} runner deaths, {time.monotonic() - started:.0f}s")
