"""Crash recovery with real process deaths (os._exit and SIGKILL) at every failpoint of ip_count's stage and commit.

Each test arms several failpoints at once, each firing once (marker files), and starts `microbatch run` again
after every death until it exits 0: one pipeline dies at each point in turn and recovers each time. Then exactly-once
is proven against an independent recount of the input (the sink, the late records, the dead letters, the published
final windows), the ledger has no hole or overlap (`microbatch verify`), no staged row is left behind, and every
batch starts from the state the one before it left.

- In Spark Connect mode (the shipped default on one machine, the suite's shared token-protected server) the stage
  task runs in the runner's own process: `stage.after_write` and `stage.after_staged` kill the runner, while
  `stage.read` kills a Python worker of the shared server mid-read, and the stage task is retried in the same run.
  Each point dies one way (os._exit or SIGKILL, `ARMED`); test_row_sinks_crash_points.py kills the same points
  the other way, so each (point, mode) of the matrix runs once.
- In spark-submit mode the stage's points kill the spark-submit driver (or its Python worker) and Airflow retries
  the stage in the same run: the driver deaths are where the two modes differ, so they run in both.
- The commit's points run in the runner in both modes; they run here in Connect mode only.
The publisher's points are test_row_sinks_crash_points.py's and tests/integration/test_publisher.py's.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from tests.e2e.helpers import assert_exactly_once, cli, run_pipeline, write_test_spec

pytestmark = pytest.mark.chaos

READ_LIMIT = 7  # the seeds' "fail after 7 records": a Python worker dies mid-read
BATCH = 500  # 3,000 lines in batches of 500, three batches per run: two runs of three
# The batches left open when the runner dies at each point in Connect mode, in the order they fire: the stage
# dies inside the run's first batch (three open), the commit before the first batch's COMMIT (three open) and
# after it (two open).
RUNNER_POINTS = {"stage.after_write": 3, "stage.after_staged": 3, "commit.before_commit": 3,
                 "commit.after_commit": 2}
# Each point dies one way here and the other way in test_row_sinks_crash_points.py (whose points are these and the
# publisher's): between the two files, every point of the matrix dies both ways once.
ARMED = (f"stage.read={READ_LIMIT},stage.after_write=kill,stage.after_staged,commit.before_commit=kill,"
         "commit.after_commit")
PER_BATCH_TABLE = "ip_counts_by_batch"


def read_point(mode: str) -> str:
    return f"stage.read={READ_LIMIT}" + (":kill" if mode == "kill" else "")


def arm(points: list[str], mode: str) -> str:
    return ",".join(point + ("=kill" if mode == "kill" else "") for point in points)


def open_batches(url: str) -> int:
    with transaction(url) as session:
        return session.execute(text("SELECT count(*) FROM batches WHERE state IN ('planned', 'staged')")).scalar_one()


def fired(markers: Path) -> set[str]:
    return {p.name for p in markers.iterdir()} if markers.exists() else set()


def death_code(armed: str, point: str) -> int:
    """The exit code a runner dies with at `point`, by how the comma-separated `armed` arms it."""
    item = next(i for i in armed.split(",") if i.split("=")[0] == point)
    return -9 if item.endswith("kill") else EXIT_CODE


def run_through_deaths(env: dict[str, str], armed: dict[str, str], markers: Path, ledger_url: str,
                       left_open: dict[str, int], logs: Path) -> list[str]:
    """`microbatch run` again after every death until it exits 0. Each death must be by the mode its point is armed
    with, fire exactly one new runner point, and leave that point's open batches. The points in the order they
    killed the runner."""
    order: list[str] = []
    for attempt in range(len(left_open) + 2):
        before = fired(markers)
        result = run_pipeline(env, max_runs=6, extra_env=armed)
        (logs / f"run{attempt}.log").write_text(result.stdout + result.stderr)
        if result.returncode == 0:
            return order
        new = sorted(fired(markers) - before - {"stage.read"})
        assert len(new) == 1 and new[0] in left_open, (new, result.returncode, result.stdout[-3000:])
        assert result.returncode == death_code(armed[FAILPOINTS_ENV], new[0]), \
            f"run {attempt} died at {new[0]} with {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-2000:]}"
        assert open_batches(ledger_url) == left_open[new[0]], new[0]
        order.append(new[0])
    pytest.fail(f"the pipeline never caught up after {len(order)} deaths; logs in {logs}")


def assert_batches_chain(ledger_url: str, batches: int, runs: int) -> None:
    """`batches` committed in `runs` DAG runs, each from the state the one before it left; no staged row left."""
    with transaction(ledger_url) as session:
        rows = session.execute(text(
            "SELECT id, airflow_run_id, state_before, state_after FROM batches WHERE state = 'committed' ORDER BY id"
        )).all()
        assert session.execute(text("SELECT count(*) FROM stage_ip_counts")).scalar_one() == 0
    assert len(rows) == batches, rows
    assert len({b.airflow_run_id for b in rows}) == runs, "runs of three batches each"
    for before, after in itertools.pairwise(rows):
        assert after.state_before == before.state_after, (before, after)


def test_every_stage_and_commit_point_in_turn_through_spark_connect(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=BATCH, bootstrap=kafka.bootstrap_servers,
                            batches_per_run=3)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    lines = generate_lines(3_000, ips=25, span_seconds=60, out_of_order=0.1, malformed=0.03, seed=3)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)
    # As in the seeds: a run of batches commits first, then the job dies after 7 records of the next one.
    first = run_pipeline(env, max_runs=1)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]

    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: ARMED, FAILPOINT_DIR_ENV: str(markers)}
    order = run_through_deaths(env, armed, markers, ledger_url, RUNNER_POINTS, tmp_path)
    assert order == list(RUNNER_POINTS), order
    assert fired(markers) == {"stage.read", *RUNNER_POINTS}
    with transaction(ledger_url) as session:  # the worker's death was retried within the run: a second attempt
        assert session.execute(text("SELECT max(attempt) FROM batches")).scalar_one() >= 2

    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
    assert_batches_chain(ledger_url, batches=6, runs=2)


def test_spark_submit_driver_and_worker_deaths_are_retried_within_the_run(service_env, topic, kafka, ledger_url,
                                                                          tmp_path):
    """spark-submit: the Python worker dies mid-read (SIGKILL), then the driver once the batch is staged, before
    the commit (SIGKILL); Airflow retries the stage each time, and the one `microbatch run` of two batches ends
    exactly once. (`stage.after_write` dies by os._exit in the row sinks' test and by SIGKILL in the Connect
    matrix: in both modes the attempt's staged rows are what a retry supersedes.)"""
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=BATCH, bootstrap=kafka.bootstrap_servers,
                            batches_per_run=3, spark_mode="submit")
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    # One run of two batches (each spark-submit costs its JVM's start): the deaths all fall inside it, on the
    # first batch's attempts, and the second batch starts from the state the retried first one left.
    lines = generate_lines(1_000, ips=25, span_seconds=30, out_of_order=0.1, malformed=0.03, seed=5)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)

    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: f"{read_point('kill')},stage.after_staged=kill",
             FAILPOINT_DIR_ENV: str(markers)}
    result = run_pipeline(env, max_runs=6, extra_env=armed)
    (tmp_path / "run.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert fired(markers) == {"stage.read", "stage.after_staged"}
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT max(attempt) FROM batches")).scalar_one() >= 3  # two deaths

    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
    assert_batches_chain(ledger_url, batches=2, runs=1)


def test_per_batch_contributions_through_stage_and_commit_deaths(service_env, topic, kafka, ledger_url, tmp_path):
    """`contributions: per_batch` (the stage sums the job's rows per key; the commit keeps one per batch): the
    stage dies after writing its staged rows and the commit inside its open transaction, by SIGKILL."""
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=1500, bootstrap=kafka.bootstrap_servers)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    path = specs / "ip_count.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["sinks"][0].update(table=PER_BATCH_TABLE, contributions="per_batch")
    path.write_text(yaml.safe_dump(spec))
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    lines = generate_lines(3_000, ips=25, span_seconds=60, out_of_order=0.1, malformed=0.03, seed=6)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)

    markers = tmp_path / "fired"
    points = {"stage.after_write": 1, "commit.before_commit": 1}
    armed = {FAILPOINTS_ENV: arm(list(points), "kill"), FAILPOINT_DIR_ENV: str(markers)}
    order = run_through_deaths(env, armed, markers, ledger_url, points, tmp_path)
    assert order == list(points), order

    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out", table=PER_BATCH_TABLE)
    with transaction(ledger_url) as session:
        assert session.execute(text(f"SELECT count(*) FROM stage_{PER_BATCH_TABLE}")).scalar_one() == 0
        kept = session.execute(text(f"SELECT count(*), count(DISTINCT (batch_id, window_start, ip)) "
                                    f"FROM {PER_BATCH_TABLE}_contributions")).one()
    assert kept[0] == kept[1], "one contribution per key and batch"
