"""The `iceberg` sink end to end on real Kafka, Postgres, Spark (the suite's Spark Connect server, and one
spark-submit run) and Airflow (`dag.test()`), read back by pyiceberg's own catalog and scan, never the project's
code.

JSON clicks land in an append table partitioned by `day(ts)`. One batch goes through a zombie (attempt 1 held at a
`pause:` failpoint after writing its files, its stage lock lost, so newer attempts run meanwhile and its Iceberg
commit is refused) and through crashes of the newer attempts: by SIGKILL after Spark wrote the data files and before
the Iceberg commit, by os._exit after that commit and before the ledger records it, and by os._exit inside the
ledger's commit. Then the table equals an oracle computed here from the produced records, every committed batch is in
exactly one snapshot, `microbatch verify` passes and lists the orphaned files, which `microbatch maintain` removes.
Meanwhile the same records go through spark-submit into a second table (the smoke run of the other Spark mode),
whose driver dies by os._exit after the data files and by SIGKILL after the Iceberg commit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import text
from typer.testing import CliRunner

from microbatch.cli import app
from microbatch.dev.datagen import generate_clicks, produce_lines
from microbatch.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import STAGE_LOCK_NAMESPACE, transaction
from tests.e2e.helpers import SHORT_LIVED_DRIVER, cli, migrated_airflow_home
from tests.e2e.test_delta_sink_e2e import committed_ranges, crash_and_recover, dag_folder, facts

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 26, 9, 0, 0, tzinfo=UTC)
SINK = "clicks_lake"


def write_spec(directory: Path, name: str, topic: str, mode: str, batch: int) -> None:
    spark = {"mode": mode, "conf": {"spark.sql.shuffle.partitions": "2", "spark.sql.files.maxRecordsPerFile": "40"}}
    if mode == "submit":
        spark["conf"].update({"spark.ui.enabled": "false", **SHORT_LIVED_DRIVER})
    spec = {
        "name": name,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": batch, "commit_group_offsets": False},
        "job": {"transform": "spark_jobs.clicks:transform",
                "options": {"window_seconds": 60, "allowed_lateness_seconds": 5}},
        "sinks": [{"name": SINK, "type": "iceberg", "namespace": name, "path": f"{name}_clicks",
                   "columns": {"user": "text", "page": "text", "ts": "timestamptz"}, "partition_by": ["day(ts)"],
                   "maintenance": {"retain_hours": 0}}],
        "retries": {"count": 3, "delay_seconds": 1},
        "spark": spark,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def iceberg_table(url: str, warehouse: Path, pipeline: str):
    """The pipeline's table, loaded by pyiceberg's own SQL catalog in the ledger's database."""
    uri = url.replace("postgresql://", "postgresql+psycopg://", 1)
    catalog = SqlCatalog("microbatch", uri=uri, warehouse=f"file://{warehouse}", init_catalog_tables="false")
    return catalog.load_table((pipeline, SINK))


def table_rows(url: str, warehouse: Path, pipeline: str) -> dict[tuple[int, int], tuple[str, str | None, datetime]]:
    """The table as {(partition, offset): (user, page, ts)}, read by pyiceberg's scan; a second row fails."""
    rows = iceberg_table(url, warehouse, pipeline).scan().to_arrow().to_pylist()
    table = {(r["partition"], r["offset"]): (r["user"], r["page"], r["ts"]) for r in rows}
    assert len(table) == len(rows), "the table holds a coordinate twice"
    return table


def snapshots_by_batch(url: str, warehouse: Path, pipeline: str) -> dict[int, list[int]]:
    """Every batch id in the table's snapshot summaries, with the snapshots holding it."""
    out: dict[int, list[int]] = {}
    for snapshot in iceberg_table(url, warehouse, pipeline).snapshots():
        meta = json.loads((snapshot.summary or {}).get("microbatch") or "{}").get("microbatch")
        if meta:
            out.setdefault(meta["batch_id"], []).append(snapshot.snapshot_id)
    return out


def verify(env: dict[str, str], pipeline: str) -> str:
    """`microbatch verify PIPELINE` in this process (no interpreter to start); it must pass: its output."""
    done = CliRunner().invoke(app, ["verify", pipeline], env=env)
    assert done.exit_code == 0, done.output
    return done.output


def check_table(url: str, env: dict[str, str], pipeline: str, warehouse: Path, valid: list[tuple]) -> str:
    """Table = oracle, every committed batch in exactly one snapshot and no other batch; verify passes (its
    output)."""
    assert table_rows(url, warehouse, pipeline) == {(p, o): (u, page, ts) for p, o, u, page, ts, _ in valid}
    held = snapshots_by_batch(url, warehouse, pipeline)
    committed = sorted(b for b, _ in committed_ranges(url, pipeline))
    assert sorted(held) == committed, f"batches in the table {sorted(held)} != committed {committed}"
    assert all(len(s) == 1 for s in held.values()), f"a batch in two snapshots: {held}"
    out = verify(env, pipeline)
    assert f"iceberg {SINK}: {len(committed)} committed batches, each in one snapshot" in " ".join(out.split())
    return " ".join(out.split())


def produce(kafka, topic: str, n: int, i: int) -> list[tuple]:
    clicks = generate_clicks(n, users=25, span_seconds=180, late=0.05, start=T0 + timedelta(minutes=10 * i),
                             seed=31 + i)
    return facts(clicks, produce_lines(kafka.bootstrap_servers, topic, clicks))


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "microbatch.cli", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stage_lock_sql(action: str) -> str:
    """`action` (a count of pids, or of terminated backends) over the sessions holding the stage lock of pipeline
    `ice`'s newest batch in this test's database."""
    return (f"SELECT count({action}) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
            "'advisory' AND l.classid = :ns AND l.objid = (SELECT max(b.id) FROM batches b JOIN pipelines p ON "
            "p.id = b.pipeline_id WHERE p.name = 'ice') AND l.granted AND a.datname = current_database()")


def wait_for(condition, seconds: float, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.2)


def test_iceberg_sink_exactly_once_through_a_zombie_and_crashes(service_env, topic, kafka, ledger_url, tmp_path):
    warehouse = tmp_path / "warehouse"
    specs = tmp_path / "pipelines"
    write_spec(specs, "ice", topic, "auto", batch=300)
    write_spec(specs, "ice_submit", topic, "submit", batch=300)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, "ice", "ice_submit")}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    table = iceberg_table(ledger_url, warehouse, "ice")
    assert [str(f.transform) for f in table.spec().fields] == ["day"]
    assert str(table.schema().find_field("ts").field_type) == "timestamptz"
    valid = produce(kafka, topic, 300, 0)  # one batch of each pipeline

    # The spark-submit smoke run, alongside (its own Airflow home: one SQLite file per dag.test() process). Its
    # driver dies by os._exit after the data files (before the Iceberg commit), then by SIGKILL after the Iceberg
    # commit (before the ledger records it): each point by the other crash than the Connect half's below. Airflow's
    # retries of the stage finish the batch.
    submit_fired = tmp_path / "fired-submit"
    submit = spawn({**env, "AIRFLOW_HOME": str(migrated_airflow_home(tmp_path / "airflow-submit")),
                    FAILPOINTS_ENV: "stage.before_lake_commit,stage.after_lake_commit=kill",
                    FAILPOINT_DIR_ENV: str(submit_fired)},
                   "run", "ice_submit", "--max-runs", "3")

    # Attempt 1 of the batch holds after writing its files, and its stage lock is lost (as when Postgres drops the
    # connection), so newer attempts stage the batch meanwhile; they start once attempt 1 holds the lock.
    fired = tmp_path / "fired-zombie"
    zombie = spawn({**env, "AIRFLOW_HOME": str(migrated_airflow_home(tmp_path / "airflow-zombie")),
                    FAILPOINTS_ENV: "stage.before_lake_commit=pause:60", FAILPOINT_DIR_ENV: str(fired)},
                   "run", "ice", "--max-runs", "1")

    def held(action: str) -> int:
        with transaction(ledger_url) as session:
            return session.execute(text(stage_lock_sql(action)), {"ns": STAGE_LOCK_NAMESPACE}).scalar_one()

    wait_for(lambda: held("l.pid") == 1, 180, zombie)
    dropped: list[int] = []

    def drop_the_zombies_lock() -> None:
        deadline = time.monotonic() + 180
        while not (fired / "stage.before_lake_commit").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        dropped.append(held("pg_terminate_backend(l.pid)"))

    dropping = threading.Thread(target=drop_the_zombies_lock, daemon=True)
    dropping.start()

    # The newer attempts crash at every point of the two commits: SIGKILL after the data files (before the Iceberg
    # commit), os._exit after the Iceberg commit (before the ledger records it), os._exit inside the ledger's commit
    # (its SIGKILL is the crash matrix's, tests/chaos). The zombie's Iceberg commit is refused meanwhile.
    crash_and_recover(env, "ice", {FAILPOINTS_ENV: "stage.before_lake_commit=kill,stage.after_lake_commit,"
                                                   "commit.before_commit"}, tmp_path / "fired")
    dropping.join(timeout=10)
    assert dropped == [1]
    zombie_out, _ = zombie.communicate(timeout=300)
    assert "is a zombie and does not write clicks_lake" in zombie_out, zombie_out[-4000:]
    out = check_table(ledger_url, env, "ice", warehouse, valid)
    (batch_id, ranges), = committed_ranges(ledger_url, "ice")
    # The orphans: the zombie's attempt and the one killed after its files (attempt numbers depend on retries).
    zombie_attempt = int(re.search(r"attempt (\d+) is a zombie", zombie_out).group(1))
    committing = json.loads(iceberg_table(ledger_url, warehouse, "ice").current_snapshot().summary["microbatch"])
    orphaned = {int(a) for a in re.findall(rf"microbatch-{batch_id}-(\d+)", out)}
    assert "attempts that never committed" in out and len(orphaned) >= 2, out
    assert zombie_attempt in orphaned and committing["microbatch"]["attempt"] not in orphaned, (orphaned, out)

    # The maintenance DAG (its spark-submit job, as a Delta table's) removes the orphans and nothing else.
    maintained = cli(env, "maintain", "ice")
    assert maintained.returncode == 0, (maintained.stdout + maintained.stderr)[-4000:]
    out = check_table(ledger_url, env, "ice", warehouse, valid)
    assert "orphaned" not in out, out
    folders = sorted(p.name for p in (warehouse / "ice_clicks" / "data").iterdir())
    assert len(folders) == len(committed_ranges(ledger_url, "ice")), folders

    # `microbatch find` names the snapshot that holds an offset; `microbatch show` reads the table.
    partition, start, _ = ranges[0]
    found = CliRunner().invoke(app, ["find", "ice", topic, str(partition), str(start)], env=env)
    assert found.exit_code == 0, found.output
    snapshot = snapshots_by_batch(ledger_url, warehouse, "ice")[batch_id][0]
    assert f"iceberg {SINK}: in snapshot {snapshot} of ice.{SINK}" in " ".join(found.output.split()), found.output
    shown = CliRunner().invoke(app, ["show", "ice", SINK, "--count-by", "user"], env=env)
    assert shown.exit_code == 0 and "pyiceberg" in shown.output, shown.output

    submit_out, _ = submit.communicate(timeout=600)
    assert submit.returncode == 0, submit_out[-4000:]
    assert sorted(os.listdir(submit_fired)) == ["stage.after_lake_commit", "stage.before_lake_commit"]
    check_table(ledger_url, env, "ice_submit", warehouse, valid)
