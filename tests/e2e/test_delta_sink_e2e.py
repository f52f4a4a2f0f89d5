"""The `delta` (Delta Lake) sink end to end on real Kafka, Postgres, Spark (spark-submit) and Airflow
(`dag.test()`), read back by an independent reader: delta-rs (`deltalake`), never Spark.

JSON clicks land in an append table partitioned by `day(ts)` and in an upsert table of each user's last page
(tombstones included), through crashes by os._exit and by SIGKILL before the Delta commit, after it but before
the ledger's commit, and inside the ledger's commit; a zombie write of a committed batch adds no version; a
replay of a past range replaces its rows in ONE Delta commit; bad tables are refused before anything opens.
After each, the tables equal an oracle computed here from the produced records, every committed batch is in
exactly one table version, and `microbatch verify` passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from sqlalchemy import text

from microbatch.dev.datagen import generate_clicks, produce_lines
from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from microbatch.runtime import PROJECT_ROOT
from tests.e2e.helpers import cli, migrated_airflow_home

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 25, 9, 0, 0, tzinfo=UTC)


def write_spec(directory: Path, name: str, topic: str, upsert: bool, batch: int = 250) -> None:
    sinks = [{"name": "clicks_lake", "type": "delta", "path": f"{name}_clicks", "mode": "append",
              "columns": {"user": "text", "page": "text", "ts": "timestamptz"}, "partition_by": ["day(ts)"],
              "maintenance": {"retain_hours": 0}}]
    if upsert:
        sinks.append({"name": "user_last_page", "type": "delta", "path": f"{name}_users", "mode": "upsert",
                      "columns": {"user": "text", "page": "text", "ts": "timestamptz"}, "keys": ["user"],
                      "order_by": "ts", "delete_column": "forget"})
    spec = {
        "name": name,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": batch, "commit_group_offsets": False},
        "job": {"transform": "spark_jobs.clicks:transform",
                "options": {"window_seconds": 60, "allowed_lateness_seconds": 5}},
        "sinks": sinks,
        "retries": {"count": 3, "delay_seconds": 1, "backoff": 1},
        # Small files on purpose (as small batches make them), for the maintenance DAG to compact.
        "spark": {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "2",
                                           "spark.sql.files.maxRecordsPerFile": "25"}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def dag_folder(tmp_path: Path, *pipelines: str) -> dict[str, str]:
    """A DAG folder with only these pipelines' thin DAG files, and an Airflow home of its own."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in pipelines:
        (dags / f"{name}.py").write_text(
            "from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag\n\n"
            f"dag = pipeline_dag({name!r})\nbackfill = backfill_dag({name!r})\nmaint = maintenance_dag({name!r})\n")
    home = migrated_airflow_home(tmp_path / "airflow")
    return {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW_HOME": str(home)}


def cli_long(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`microbatch ARGS...` for commands that run Spark (backfill, maintain): minutes on a loaded machine."""
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900, check=False)


def run(env: dict[str, str], pipeline: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "microbatch.cli", "run", pipeline, "--max-runs", "12"],
                          env={**os.environ, **env, **(extra or {})}, capture_output=True, text=True, timeout=900,
                          check=False)


def facts(clicks: list, coords: list[tuple[int, int]]) -> list[tuple[int, int, str, str | None, datetime, bool]]:
    """(partition, offset, user, page, ts, forget) of every valid produced click, from its JSON."""
    out = []
    for c, (p, o) in zip(clicks, coords, strict=True):
        if c.malformed:
            continue
        payload = json.loads(c.value)
        ts = datetime.strptime(payload["ts"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        out.append((p, o, payload["user"], payload.get("page"), ts, bool(payload.get("forget"))))
    return out


def lake_rows(path: Path) -> dict[tuple[int, int], tuple[str, str | None, datetime]]:
    """The append table as {(partition, offset): (user, page, ts)}, read by delta-rs; a second row fails."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    table = {(r["partition"], r["offset"]): (r["user"], r["page"], r["ts"]) for r in rows}
    assert len(table) == len(rows), "the table holds a coordinate twice"
    assert all(r["ts_day"] == r["ts"].date() for r in rows), "the generated partition column follows ts"
    return table


def committed_ranges(url: str, pipeline: str) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """The pipeline's committed batches in commit order, with their live (partition, start, end) ranges."""
    with transaction(url) as session:
        rows = session.execute(text(
            "SELECT b.id, r.partition, r.start_offset, r.end_offset FROM batches b JOIN pipelines p "
            "ON p.id = b.pipeline_id JOIN ranges r ON r.batch_id = b.id WHERE p.name = :n AND b.state = 'committed' "
            "ORDER BY b.committed_at, b.id, r.partition"), {"n": pipeline}).all()
    batches: dict[int, list[tuple[int, int, int]]] = {}
    for batch_id, p, s, e in rows:
        batches.setdefault(batch_id, []).append((p, s, e))
    return list(batches.items())


def upsert_oracle(valid: list[tuple], batches: list[tuple[int, list[tuple[int, int, int]]]]) -> dict[str, tuple]:
    """Each user's live row, by the rule of postgres_upsert: the greatest (ts, partition, offset) among the
    records of the committed batches, in whatever order they came; absent if that record is a tombstone (a
    forget, which has no page)."""
    committed = [f for f in valid
                 if any(p == f[0] and s <= f[1] < e for _, ranges in batches for p, s, e in ranges)]
    best: dict[str, tuple] = {}
    for f in committed:
        if f[2] not in best or (f[4], f[0], f[1]) > (best[f[2]][4], best[f[2]][0], best[f[2]][1]):
            best[f[2]] = f
    return {u: (f[3], f[4], f[0], f[1]) for u, f in best.items() if not f[5] and f[3] is not None}


def upsert_rows(path: Path) -> dict[str, tuple]:
    """The upsert table's live rows, read by delta-rs (a key twice fails, tombstones included)."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert len({r["user"] for r in rows}) == len(rows), "a key twice"
    return {r["user"]: (r["page"], r["ts"], r["partition"], r["offset"]) for r in rows if not r["_deleted"]}


def versions_by_batch(path: Path) -> dict[int, list[int]]:
    """Every microbatch batch id in the table's history, with the versions holding it (read by delta-rs)."""
    out: dict[int, list[int]] = {}
    for entry in DeltaTable(str(path)).history():
        meta = json.loads(entry.get("userMetadata") or "{}").get("microbatch")
        if meta:
            out.setdefault(meta["batch_id"], []).append(entry["version"])
    return out


def check_lake(url: str, env: dict[str, str], pipeline: str, warehouse: Path, valid: list[tuple],
               upsert: bool) -> None:
    assert lake_rows(warehouse / f"{pipeline}_clicks") == {(p, o): (u, page, ts) for p, o, u, page, ts, _ in valid}
    batches = committed_ranges(url, pipeline)
    committed = sorted(b for b, _ in batches)
    paths = [warehouse / f"{pipeline}_clicks", *([warehouse / f"{pipeline}_users"] if upsert else [])]
    for path in paths:
        held = versions_by_batch(path)
        assert sorted(held) == committed, f"{path.name}: batches in the table {sorted(held)} != committed"
        assert all(len(v) == 1 for v in held.values()), f"{path.name}: a batch in two versions: {held}"
    if upsert:
        assert upsert_rows(warehouse / f"{pipeline}_users") == upsert_oracle(valid, batches)
    verified = cli(env, "verify", pipeline)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "delta" in verified.stdout, verified.stdout


def crash_and_recover(env: dict[str, str], pipeline: str, armed: dict[str, str], markers: Path) -> None:
    """Run until caught up while the armed failpoints kill it (each once); every point must have fired."""
    results = []
    for _ in range(5):
        done = run(env, pipeline, {**armed, FAILPOINT_DIR_ENV: str(markers)})
        results.append(done)
        if done.returncode == 0:
            break
        assert done.returncode in (EXIT_CODE, -9), done.stdout[-3000:] + done.stderr[-3000:]
    logs = "\n".join(r.stdout[-2000:] + r.stderr[-2000:] for r in results)
    assert results[-1].returncode == 0, logs
    fired = sorted(os.listdir(markers)) if markers.exists() else []
    wanted = sorted(p.split("=")[0] for p in armed[FAILPOINTS_ENV].split(","))
    assert fired == wanted, (fired, logs)


def test_delta_sink_exactly_once_through_crashes(service_env, topic, kafka, ledger_url, tmp_path):
    warehouse = tmp_path / "warehouse"
    specs = tmp_path / "pipelines"
    write_spec(specs, "lake", topic, upsert=True, batch=500)  # one batch per round: the crashes make the runs
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, "lake")}

    # A missing table is refused before any batch opens, in one sentence naming `microbatch migrate`.
    refused = run(env, "lake")
    assert refused.returncode != 0
    assert "does not exist; run `microbatch migrate`" in refused.stdout + refused.stderr
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == 0
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert DeltaTable(str(warehouse / "lake_clicks")).metadata().partition_columns == ["ts_day"]

    # The lake's crash points once by os._exit and once by SIGKILL, over two rounds of produced clicks: before the
    # Delta commit and after it (before the ledger's commit); and once inside the ledger's open transaction, with
    # the batch's version already in the table (its SIGKILL is the crash matrix's, tests/chaos).
    rounds = [("stage.before_lake_commit", "stage.after_lake_commit=kill", "commit.before_commit"),
              ("stage.before_lake_commit=kill", "stage.after_lake_commit")]
    valid: list[tuple] = []
    for i, points in enumerate(rounds):
        start = T0 + timedelta(minutes=10 * i)
        clicks = generate_clicks(400, users=25, span_seconds=180, late=0.05, forget=0.05, start=start, seed=19 + i)
        valid += facts(clicks, produce_lines(kafka.bootstrap_servers, topic, clicks))
        crash_and_recover(env, "lake", {FAILPOINTS_ENV: ",".join(points)}, tmp_path / f"fired{i}")
        check_lake(ledger_url, env, "lake", warehouse, valid, upsert=True)

    # A zombie: an old attempt of a committed batch writes again, with other rows: through the stage's path
    # (refused by the ledger's attempt check), through the sink's write (Delta finds the batch and skips it),
    # and directly with the batch's Delta key (Delta skips it). The table gets no version.
    first = committed_ranges(ledger_url, "lake")[0][0]
    before = DeltaTable(str(warehouse / "lake_clicks")).version()
    zombie = subprocess.run([sys.executable, "-c", ZOMBIE, str(warehouse / "lake_clicks"), str(first), ledger_url],
                            env={**os.environ, **env, "PYTHONPATH": f"{PROJECT_ROOT / 'include'}:{PROJECT_ROOT}"},
                            capture_output=True, text=True, timeout=300, check=False)
    assert zombie.returncode == 0, zombie.stdout[-3000:] + zombie.stderr[-3000:]
    assert "refused: Batch" in zombie.stdout and "is a zombie and does not write clicks_lake" in zombie.stdout
    assert "wrote=False" in zombie.stdout, zombie.stdout
    assert DeltaTable(str(warehouse / "lake_clicks")).version() == before
    check_lake(ledger_url, env, "lake", warehouse, valid, upsert=True)


ZOMBIE = textwrap.dedent("""
    import os
    import sys
    from pyspark.sql import SparkSession
    from microbatch.ledger.database import Ledger, transaction
    from microbatch.ledger import repository as repo
    from microbatch.config import find_spec
    from microbatch.errors import ZombieAttemptError
    from microbatch.sinks import delta
    from microbatch.sinks.base import StageContext, write_table
    from microbatch.sinks.registry import sinks_of

    path, batch_id, url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # On the suite's Spark Connect server, where the pipeline's own stages write the table.
    spark = SparkSession.builder.remote(os.environ["MICROBATCH_SPARK_REMOTE"]).create()
    spec = find_spec("lake")
    sink = next(s for s in spec.sinks if s.name == "clicks_lake")
    with transaction(url) as session:
        batch = repo.get_batch(session, batch_id)
        owner = delta.Owner("lake", repo.pipeline_uid(session, batch.pipeline_id), sink.name)
        ranges = repo.batch_ranges(session, batch_id)
    rows = spark.createDataFrame([(r.topic, r.partition, r.start, "zombie", "/z", None) for r in ranges],
                                 "topic string, partition int, offset bigint, user string, page string, ts timestamp")
    try:  # the stage's own path: the ledger says the batch has moved on, so the zombie writes nothing
        write_table(sinks_of(spec)[sink.name], rows, Ledger(url),
                    StageContext("lake", batch.pipeline_id, owner.uid, batch_id, 1, ranges))
    except ZombieAttemptError as exc:
        print("refused:", exc)
    found, wrote = delta.write_batch(rows, sink, owner, batch_id, 1, ranges)
    print(f"version={found.version} wrote={wrote}")
    (rows.write.format("delta").mode("append").option("txnAppId", delta.app_id(owner, batch_id))
     .option("txnVersion", delta.TXN_VERSION).save(path))
    spark.stop()
""")


def test_delta_replay_replaces_a_range_in_one_commit(service_env, topic, kafka, ledger_url, tmp_path):
    warehouse = tmp_path / "warehouse"
    specs = tmp_path / "pipelines"
    write_spec(specs, "lake", topic, upsert=True, batch=200)
    write_spec(specs, "landing", topic, upsert=False, batch=200)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, "lake", "landing")}
    assert cli(env, "migrate").returncode == 0
    clicks = generate_clicks(400, users=20, span_seconds=120, start=T0, seed=23)  # two batches of 200
    coords = produce_lines(kafka.bootstrap_servers, topic, clicks)
    valid = facts(clicks, coords)
    done = run(env, "landing")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check_lake(ledger_url, env, "landing", warehouse, valid, upsert=False)

    # Someone deletes and rewrites rows of partition 0's first two ranges (delta-rs, outside microbatch).
    (_, r1), (_, r2) = [(b, [r for r in rs if r[0] == 0]) for b, rs in committed_ranges(ledger_url, "landing")
                        if any(r[0] == 0 for r in rs)][:2]
    s1, e2 = r1[0][1], r2[0][2]
    path = warehouse / "landing_clicks"
    DeltaTable(str(path)).delete(f'"partition" = 0 AND "offset" >= {s1} AND "offset" < {e2 - 1}')
    before = DeltaTable(str(path)).version()
    replay = cli_long(env, "backfill", "landing", "--topic", topic, "--mode", "replay", "--partitions", "0",
                 "--start", str(s1), "--end", str(e2))
    assert replay.returncode == 0, (replay.stdout + replay.stderr)[-4000:]
    table = DeltaTable(str(path))
    new = [h for h in table.history() if h["version"] > before]
    replays = [h for h in new if json.loads(h.get("userMetadata") or "{}").get("microbatch")]
    assert len(replays) == len(new) >= 1, new
    with transaction(ledger_url) as session:
        replay_batches = session.execute(text("SELECT count(*) FROM batches WHERE kind = 'replay' AND state = "
                                              "'committed'")).scalar_one()
    assert len(replays) == replay_batches, "one Delta commit per replay batch"
    rows = lake_rows(path)
    assert rows == {(p, o): (u, page, ts) for p, o, u, page, ts, _ in valid}
    verified = cli(env, "verify", "landing")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The maintenance DAG compacts the small files into fewer; the rows, the history's batches and verify stay.
    files_before = len(DeltaTable(str(path)).file_uris())
    assert files_before >= 10, files_before
    maintained = cli_long(env, "maintain", "landing")
    assert maintained.returncode == 0, (maintained.stdout + maintained.stderr)[-4000:]
    assert len(DeltaTable(str(path)).file_uris()) < files_before
    assert lake_rows(path) == {(p, o): (u, page, ts) for p, o, u, page, ts, _ in valid}
    assert len(list(path.rglob("*.parquet"))) == len(DeltaTable(str(path)).file_uris()), "vacuumed"
    verified = cli(env, "verify", "landing")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # A replay of a pipeline with a delta upsert table is refused before anything opens.
    refused = cli(env, "backfill", "lake", "--topic", topic, "--mode", "replay", "--partitions", "0",
                  "--start", str(s1), "--end", str(e2))
    assert refused.returncode != 0
    assert "is a delta upsert table" in refused.stdout + refused.stderr
