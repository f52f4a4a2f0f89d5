"""The `iceberg` sink end to end on real Kafka, Postgres, Spark (the suite's Spark Connect server, and one
spark-submit run) and Airflow (`dag.test()`), read back by pyiceberg's own catalog and scan, never the project's
code.

JSON clicks land in an append table partitioned by `day(ts)`, through crashes by os._exit and by SIGKILL after
Spark wrote the data files and before the Iceberg commit, after that commit and before the ledger records it, and
inside the ledger's commit; and through a zombie: an attempt held at a `pause:` failpoint after its files while a
newer attempt of the batch commits, whose Iceberg commit is then refused. After each, the table equals an oracle
computed here from the produced records, every committed batch is in exactly one snapshot, `microbatch verify`
passes and lists the orphaned files, which `microbatch maintain` removes. A replay is refused in one sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import text

from microbatch.dev.datagen import generate_clicks, produce_lines
from microbatch.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import STAGE_LOCK_NAMESPACE, transaction
from tests.e2e.helpers import cli, migrated_airflow_home
from tests.e2e.test_delta_sink_e2e import cli_long, committed_ranges, crash_and_recover, dag_folder, facts, run

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 26, 9, 0, 0, tzinfo=UTC)
SINK = "clicks_lake"


def write_spec(directory: Path, name: str, topic: str, mode: str, batch: int) -> None:
    spark = {"mode": mode, "conf": {"spark.sql.shuffle.partitions": "2", "spark.sql.files.maxRecordsPerFile": "40"}}
    if mode == "submit":
        spark["conf"]["spark.ui.enabled"] = "false"
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


def check_table(url: str, env: dict[str, str], pipeline: str, warehouse: Path, valid: list[tuple]) -> str:
    """Table = oracle, every committed batch in exactly one snapshot and no other batch; verify passes (its
    output)."""
    assert table_rows(url, warehouse, pipeline) == {(p, o): (u, page, ts) for p, o, u, page, ts, _ in valid}
    held = snapshots_by_batch(url, warehouse, pipeline)
    committed = sorted(b for b, _ in committed_ranges(url, pipeline))
    assert sorted(held) == committed, f"batches in the table {sorted(held)} != committed {committed}"
    assert all(len(s) == 1 for s in held.values()), f"a batch in two snapshots: {held}"
    verified = cli(env, "verify", pipeline)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"iceberg {SINK}: {len(committed)} committed batches, each in one snapshot" in verified.stdout
    return verified.stdout


def produce(kafka, topic: str, n: int, i: int) -> list[tuple]:
    clicks = generate_clicks(n, users=25, span_seconds=180, late=0.05, start=T0 + timedelta(minutes=10 * i),
                             seed=31 + i)
    return facts(clicks, produce_lines(kafka.bootstrap_servers, topic, clicks))


def test_iceberg_sink_exactly_once_through_crashes(service_env, topic, kafka, ledger_url, tmp_path):
    warehouse = tmp_path / "warehouse"
    specs = tmp_path / "pipelines"
    write_spec(specs, "ice", topic, "auto", batch=150)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, "ice")}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    table = iceberg_table(ledger_url, warehouse, "ice")
    assert [str(f.transform) for f in table.spec().fields] == ["day"]
    assert str(table.schema().find_field("ts").field_type) == "timestamptz"

    # Every crash point by os._exit, then by SIGKILL (the ledger commit's SIGKILL is the crash matrix's, tests/chaos):
    # after the data files, after the Iceberg commit (before the ledger records it), inside the ledger's commit.
    rounds = [("stage.lake_files_written", "stage.lake_commit_unrecorded", "commit.before_commit"),
              ("stage.lake_files_written=kill", "stage.lake_commit_unrecorded=kill")]
    valid: list[tuple] = []
    for i, points in enumerate(rounds):
        valid += produce(kafka, topic, 300, i)
        crash_and_recover(env, "ice", {FAILPOINTS_ENV: ",".join(points)}, tmp_path / f"fired{i}")
        out = check_table(ledger_url, env, "ice", warehouse, valid)
    assert "orphaned data files of 2 attempts that never committed" in out, out

    # A zombie: attempt 1 of a batch holds after writing its files; its stage lock is lost (as when Postgres
    # drops the connection), so a second run stages attempt 2 and commits the batch. Attempt 1's Iceberg commit is
    # then refused by the ledger's fence, and its files are orphans.
    valid += produce(kafka, topic, 100, 2)
    fired = tmp_path / "fired-zombie"
    zombie = subprocess.Popen(
        [sys.executable, "-m", "microbatch.cli", "run", "ice", "--max-runs", "1"],
        env={**os.environ, **env, FAILPOINTS_ENV: "stage.lake_files_written=pause:30", FAILPOINT_DIR_ENV: str(fired)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (fired / "stage.lake_files_written").exists():
        assert zombie.poll() is None and time.monotonic() < deadline, zombie.communicate()[0][-3000:]
        time.sleep(0.2)
    with transaction(ledger_url) as session:
        dropped = session.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND classid = :ns "
            "AND granted"), {"ns": STAGE_LOCK_NAMESPACE}).scalar_one()
    assert dropped == 1
    newer = run({**env, "AIRFLOW_HOME": str(migrated_airflow_home(tmp_path / "airflow-newer"))}, "ice")
    assert newer.returncode == 0, newer.stdout[-3000:] + newer.stderr[-3000:]
    zombie_out, _ = zombie.communicate(timeout=300)
    assert "is a zombie and does not write clicks_lake" in zombie_out, zombie_out[-4000:]
    out = check_table(ledger_url, env, "ice", warehouse, valid)
    assert "orphaned data files of 3 attempts that never committed" in out, out

    # The maintenance DAG removes the orphans and nothing else.
    maintained = cli_long(env, "maintain", "ice")
    assert maintained.returncode == 0, (maintained.stdout + maintained.stderr)[-4000:]
    out = check_table(ledger_url, env, "ice", warehouse, valid)
    assert "orphaned" not in out, out
    folders = sorted(p.name for p in (warehouse / "ice_clicks" / "data").iterdir())
    assert len(folders) == len(committed_ranges(ledger_url, "ice")), folders

    # A replay into an Iceberg table is refused before anything opens.
    with transaction(ledger_url) as session:
        before = session.execute(text("SELECT count(*) FROM batches")).scalar_one()
    refused = cli(env, "backfill", "ice", "--topic", topic, "--mode", "replay", "--partitions", "0",
                  "--start", "0", "--end", "10")
    assert refused.returncode != 0
    assert "is an iceberg table, which microbatch cannot replay into yet" in refused.stdout + refused.stderr
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == before


def test_iceberg_sink_spark_submit(service_env, topic, kafka, ledger_url, tmp_path):
    """The same sink staged by spark-submit (Spark's own driver writes the files): table = oracle, verify passes."""
    warehouse = tmp_path / "warehouse"
    specs = tmp_path / "pipelines"
    write_spec(specs, "ice_submit", topic, "submit", batch=500)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, "ice_submit")}
    assert cli(env, "migrate").returncode == 0
    valid = produce(kafka, topic, 400, 0)
    done = run(env, "ice_submit")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check_table(ledger_url, env, "ice_submit", warehouse, valid)
