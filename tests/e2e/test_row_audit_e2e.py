"""The ledger proves rows, not only offsets (issue 58), on the path a new user takes: the default warehouse
(`MICROBATCH_WAREHOUSE` unset, so the lakehouse tables live under the checkout's `.cache/warehouse`), the shipped
Spark mode (`auto`, here the suite's Spark Connect server), a YAML + SQL pipeline of JSON records into a
`postgres_append`, an `iceberg` (named by `table:`) and a `delta` append sink.

Each table must equal an oracle computed here from the produced records (decoded by Python's json, read back by
psycopg, pyiceberg and delta-rs). Then rows go missing behind the ledger's back: a Postgres DELETE, a pyiceberg
delete, a Delta delete (a commit that removes data files). `microbatch verify` must fail naming each sink and batch
with the two counts; `microbatch reland` lands exactly those batches again into one sink at a time, leaving the
others as they are, until every table equals the oracle and `verify` passes again."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from kafka import KafkaProducer
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from sqlalchemy import text
from typer.testing import CliRunner

from microbatch.cli import app
from microbatch.ledger.database import transaction
from microbatch.runtime import cache_dir
from tests.e2e.helpers import cli
from tests.e2e.test_delta_sink_e2e import cli_long, dag_folder, run

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 28, 8, 0, 0, tzinfo=UTC)
COLUMNS = {"user": "text", "page": "text", "ts": "timestamptz"}
SQL = "SELECT `user`, page, ts FROM records"


def write_spec(directory: Path, name: str, topic: str, lake: str) -> None:
    spec = {
        "name": name,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 130, "commit_group_offsets": False,
                   "value": {"format": "json", "fields": {"user": "string", "page": "string", "ts": "timestamp"},
                             "required": ["user", "ts"]}},
        "sinks": [
            {"name": "raw", "type": "postgres_append", "table": f"{name}_raw", "columns": COLUMNS, "sql": SQL},
            {"name": "ice", "type": "iceberg", "table": "clicks_iceberg", "namespace": name, "path": f"{lake}/ice",
             "columns": COLUMNS, "partition_by": ["day(ts)"], "sql": SQL},
            {"name": "lake", "type": "delta", "path": f"{lake}/delta", "mode": "append", "columns": COLUMNS,
             "sql": SQL},
        ],
        "retries": {"count": 2, "delay_seconds": 1, "backoff": 1},
        "spark": {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "2"}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def produce(bootstrap: str, topic: str, n: int) -> dict[tuple[int, int], tuple[str, str | None, datetime]]:
    """n records over the topic's 4 partitions, 1 in 40 not JSON (a dead letter); the oracle: the valid records
    as {(partition, offset): (user, page, ts)}, decoded here by Python's json."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    sent = []
    for i in range(n):
        if i % 40 == 7:
            value = b"{not json"
        else:
            ts = (T0 + timedelta(seconds=37 * i)).strftime("%Y-%m-%dT%H:%M:%SZ")
            page = None if i % 11 == 0 else f"/p{i % 5}"
            value = json.dumps({"user": f"u{i % 13}", "page": page, "ts": ts}).encode()
        sent.append((value, producer.send(topic, value=value, partition=i % 4)))
    producer.flush()
    oracle = {}
    for value, future in sent:
        meta = future.get(timeout=30)
        try:
            payload = json.loads(value)
        except ValueError:
            continue
        ts = datetime.strptime(payload["ts"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        oracle[(meta.partition, meta.offset)] = (payload["user"], payload["page"], ts)
    producer.close()
    return oracle


def as_table(rows: list[dict]) -> dict[tuple[int, int], tuple]:
    table = {(r["partition"], r["offset"]): (r["user"], r["page"], r["ts"]) for r in rows}
    assert len(table) == len(rows), "a table holds a coordinate twice"
    return table


def postgres_rows(url: str, table: str) -> dict[tuple[int, int], tuple]:
    with transaction(url) as session:
        rows = session.execute(text(f'SELECT "user", page, ts, "partition", "offset" FROM {table}')).mappings().all()
    return as_table([dict(r) for r in rows])


def iceberg(url: str, name: str):
    catalog = SqlCatalog("microbatch", uri=url.replace("postgresql://", "postgresql+psycopg://", 1),
                         warehouse=f"file://{cache_dir() / 'warehouse'}", init_catalog_tables="false")
    return catalog.load_table((name, "clicks_iceberg"))


def tables(url: str, name: str, lake: Path) -> dict[str, dict[tuple[int, int], tuple]]:
    return {"raw": postgres_rows(url, f"{name}_raw"),
            "ice": as_table(iceberg(url, name).scan().to_arrow().to_pylist()),
            "lake": as_table(DeltaTable(str(lake / "delta")).to_pyarrow_table().to_pylist())}


def invoke(env: dict[str, str], *args: str):
    """`microbatch ARGS...` in this process (no interpreter to start), for the commands that run no Spark."""
    return CliRunner().invoke(app, list(args), env={**env, "COLUMNS": "250"})


def differing(output: str) -> dict[str, set[int]]:
    """verify's row sentences: {sink: batches}."""
    found: dict[str, set[int]] = {}
    for sink, batch in re.findall(r"rows: pipeline \w+, sink (\w+), batch (\d+): the ledger committed \d+ rows, "
                                  r"the table holds \d+", " ".join(output.split())):
        found.setdefault(sink, set()).add(int(batch))
    return found


def test_rows_audited_and_relanded_on_the_default_warehouse(service_env, topic, kafka, ledger_url, tmp_path):
    name = f"rows_{uuid.uuid4().hex[:8]}"
    lake_dir = f"test-{name}"  # under the default warehouse, which every worker shares: a folder of its own
    lake = cache_dir() / "warehouse" / lake_dir
    specs = tmp_path / "pipelines"
    write_spec(specs, name, topic, lake_dir)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **dag_folder(tmp_path, name)}
    assert "MICROBATCH_WAREHOUSE" not in env
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "not created" not in migrated.stdout and f"create iceberg table {name}.clicks_iceberg" in migrated.stdout
    try:
        oracle = produce(kafka.bootstrap_servers, topic, 240)
        done = run(env, name)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert tables(ledger_url, name, lake) == {"raw": oracle, "ice": oracle, "lake": oracle}
        verified = invoke(env, "verify", name)
        assert verified.exit_code == 0, verified.output
        out = " ".join(verified.output.split())
        for sink in ("postgres_append raw", "iceberg ice", "delta lake"):
            assert re.search(rf"ok: {sink}: {len(oracle)} rows of \d+ committed batches", out), out

        # Rows go missing behind the ledger's back, a different partition in each table.
        with transaction(ledger_url) as session:
            session.execute(text(f'DELETE FROM {name}_raw WHERE "partition" = 0 AND "offset" < 30'))
        iceberg(ledger_url, name).delete(EqualTo("partition", 1))
        DeltaTable(str(lake / "delta")).delete('"partition" = 2')
        damaged = invoke(env, "verify", name)
        assert damaged.exit_code == 1 and isinstance(damaged.exception, SystemExit), damaged.output  # no traceback
        lost = differing(damaged.output)
        assert set(lost) == {"raw", "ice", "lake"} and all(lost.values()), damaged.output

        # One sink at a time: the others stay as they are until their own reland.
        relanded = cli_long(env, "reland", name, "raw")
        assert relanded.returncode == 0, relanded.stdout[-3000:] + relanded.stderr[-3000:]
        assert "now holds the rows the ledger committed" in relanded.stdout, relanded.stdout
        now = tables(ledger_url, name, lake)
        assert now["raw"] == oracle and now["ice"] != oracle and now["lake"] != oracle
        assert set(differing(invoke(env, "verify", name).output)) == {"ice", "lake"}
        relanded = cli_long(env, "reland", name, "ice", "lake")  # two sinks in one command, each on its own
        assert relanded.returncode == 0, relanded.stdout[-3000:] + relanded.stderr[-3000:]
        assert relanded.stdout.count("now holds the rows the ledger committed") == 2, relanded.stdout
        assert tables(ledger_url, name, lake) == {"raw": oracle, "ice": oracle, "lake": oracle}
        verified = invoke(env, "verify", name)
        assert verified.exit_code == 0, verified.output
        with transaction(ledger_url) as session:
            relands = session.execute(text(
                "SELECT b.counts -> 'relands' FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                "WHERE p.name = :n AND b.counts ? 'relands'"), {"n": name}).scalars().all()
        assert {sink for r in relands for sink in r} == {"raw", "ice", "lake"}
        shown = invoke(env, "show", name, "ice")
        assert shown.exit_code == 0 and f"{len(oracle)} rows" in " ".join(shown.output.split()), shown.output
    finally:
        import shutil

        shutil.rmtree(lake, ignore_errors=True)
