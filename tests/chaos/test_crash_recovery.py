"""Crash recovery with real process deaths (os._exit and SIGKILL) at every failpoint of the path.

Each case arms one failpoint for one firing, runs the ip_count DAG (dag.test in its own
process, real spark-submit), lets Airflow retry or starts the next run when the whole
process died, and then proves exactly-once: the sink equals an independent recount of
the input, dead letters equal the malformed lines, and the ledger has no hole or overlap.
"""

from __future__ import annotations

import itertools

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from tests.e2e.helpers import assert_exactly_once, cli, run_pipeline, write_test_spec

pytestmark = pytest.mark.chaos

CASES = {
    # name: (failpoint, where it kills, does the dag.test process itself die?)
    "seeds_fail_after_7_records": ("stage.read=7", "the Spark Python worker, mid-read", False),
    "after_staging": ("stage.after_write", "the spark-submit driver, staged rows written", False),
    "after_staged_sigkill": ("stage.after_staged=kill", "the spark-submit driver, batch marked staged", False),
    "inside_commit_before_commit": ("commit.before_commit", "the commit task, transaction open", True),
    "inside_commit_sigkill": ("commit.before_commit=kill", "the commit task, transaction open", True),
    "after_commit_before_return": ("commit.after_commit", "the commit task, after COMMIT", True),
}


# Every case with the default contributions per source partition, and the stage's and the commit's deaths again
# with `contributions: per_batch` (the stage then sums the job's rows per key; the commit keeps one per batch).
RUNS = [*((case, "per_partition") for case in CASES), ("after_staging", "per_batch"),
        ("inside_commit_sigkill", "per_batch")]
PER_BATCH_TABLE = "ip_counts_by_batch"


def per_batch_spec(specs, env: dict[str, str]) -> str:
    """Switch the test spec's aggregate sink to `contributions: per_batch` on a table of its own (the ledger's
    `ip_counts` keeps them per partition) and create it with `microbatch migrate`; the table's name."""
    path = specs / "ip_count.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["sinks"][0].update(table=PER_BATCH_TABLE, contributions="per_batch")
    path.write_text(yaml.safe_dump(spec))
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    return PER_BATCH_TABLE


@pytest.mark.parametrize(("case", "contributions"), RUNS)
def test_crash_then_recover_exactly_once(case, contributions, service_env, topic, kafka, ledger_url, tmp_path):
    failpoint, _, kills_runner = CASES[case]
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=1500, bootstrap=kafka.bootstrap_servers)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    table = per_batch_spec(specs, env) if contributions == "per_batch" else "ip_counts"
    lines = generate_lines(3_000, ips=25, span_seconds=60, out_of_order=0.1, malformed=0.03, seed=len(case))
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)

    if case == "seeds_fail_after_7_records":
        # As in the seeds: some batches commit first, then the job dies after 7 records of the next one.
        first = run_pipeline(env, max_runs=1)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]

    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: failpoint, FAILPOINT_DIR_ENV: str(markers)}
    crashed = run_pipeline(env, max_runs=5, extra_env=armed)
    name = failpoint.split("=")[0]
    assert (markers / name).exists(), f"failpoint {name} never fired:\n{crashed.stdout[-3000:]}"
    if kills_runner:
        assert crashed.returncode in (EXIT_CODE, -9), crashed.stdout[-2000:] + crashed.stderr[-2000:]
        with transaction(ledger_url) as session:
            open_batches = session.execute(text("SELECT count(*) FROM batches WHERE state IN ('planned', 'staged')"))
            assert open_batches.scalar_one() == (0 if name == "commit.after_commit" else 1)
        recovered = run_pipeline(env, max_runs=5, extra_env=armed)
        assert recovered.returncode == 0, recovered.stdout[-3000:] + recovered.stderr[-3000:]
    else:
        # The spark-submit process died; Airflow's retry of the stage task recovered in the same run.
        assert crashed.returncode == 0, crashed.stdout[-3000:] + crashed.stderr[-3000:]
        with transaction(ledger_url) as session:
            attempts = session.execute(text("SELECT max(attempt) FROM batches")).scalar_one()
        assert attempts >= 2

    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out", table=table)
    with transaction(ledger_url) as session:
        staged_left = session.execute(text(f"SELECT count(*) FROM stage_{table}")).scalar_one()
        kept = session.execute(text(f"SELECT count(*), count(DISTINCT (batch_id, window_start, ip)) "
                                    f"FROM {table}_contributions")).one()
    assert staged_left == 0
    if contributions == "per_batch":
        assert kept[0] == kept[1], "one contribution per key and batch"


CHAIN_CASES = {
    # name: (failpoint, open batches left when the runner itself dies, else None)
    "stage_dies_between_batches": ("stage.after_staged=kill", None),
    "commit_dies_inside_the_first_batch": ("commit.before_commit", 3),
    "commit_dies_between_batches": ("commit.after_commit=kill", 2),
}


@pytest.mark.parametrize("case", list(CHAIN_CASES))
def test_crash_inside_a_run_of_several_batches_then_recover_exactly_once(case, service_env, topic, kafka,
                                                                         ledger_url, tmp_path):
    """source.max_batches_per_run: 3: one run plans 3 batches, one spark-submit stages them in order (each from
    the state the one before leaves), and the commit task commits them in order. A death after the run's first
    batch, in the stage or the commit, leaves the rest open; the next attempt finishes them exactly once."""
    failpoint, left_open = CHAIN_CASES[case]
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=500, bootstrap=kafka.bootstrap_servers,
                            batches_per_run=3)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    lines = generate_lines(3_000, ips=25, span_seconds=60, out_of_order=0.1, malformed=0.03, seed=len(case) + 100)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)

    markers = tmp_path / "fired"
    armed = {FAILPOINTS_ENV: failpoint, FAILPOINT_DIR_ENV: str(markers)}
    crashed = run_pipeline(env, max_runs=5, extra_env=armed)
    assert (markers / failpoint.split("=")[0]).exists(), f"{failpoint} never fired:\n{crashed.stdout[-3000:]}"
    if left_open is not None:
        assert crashed.returncode in (EXIT_CODE, -9), crashed.stdout[-2000:] + crashed.stderr[-2000:]
        with transaction(ledger_url) as session:
            open_batches = session.execute(text("SELECT count(*) FROM batches WHERE state IN ('planned', 'staged')"))
            assert open_batches.scalar_one() == left_open
        recovered = run_pipeline(env, max_runs=5, extra_env=armed)
        assert recovered.returncode == 0, recovered.stdout[-3000:] + recovered.stderr[-3000:]
    else:
        assert crashed.returncode == 0, crashed.stdout[-3000:] + crashed.stderr[-3000:]

    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
    with transaction(ledger_url) as session:
        batches = session.execute(text(
            "SELECT id, airflow_run_id, state_before, state_after FROM batches WHERE state = 'committed' ORDER BY id"
        )).all()
        staged_left = session.execute(text("SELECT count(*) FROM stage_ip_counts")).scalar_one()
    assert staged_left == 0
    assert len(batches) == 6, batches  # 3,000 records in batches of 500
    assert len({b.airflow_run_id for b in batches}) == 2, "two runs of three batches each"
    for before, after in itertools.pairwise(batches):
        assert after.state_before == before.state_after, (before, after)  # each batch starts from the last's state
