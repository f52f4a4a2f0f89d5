"""The ledger page at scale: --pipelines pipelines x --partitions partitions x --batches batches of history.

Fills a fresh ledger (an embedded PostgreSQL on loopback, migrated by Alembic) with one committed batch a
minute per pipeline, ending now, so 10,000 batches span the last week: each batch with its counts, step
seconds, one range and one lag snapshot per partition, all written by `INSERT ... SELECT generate_series`.
Then renders the page (the app of `microbatch.ui`, in process, as the plugin mounts it: every pipeline's
tables, and the charts of the first) for each time range, and reports the median of --reps renders, with the
size of the HTML.

    PYTHONPATH=include:. .venv/bin/python bench/ledger_page.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median, print_table, reproduce_command, write_results

FILL = [
    "INSERT INTO pipelines (name, spec_hash) SELECT 'bench_' || lpad(i::text, 2, '0'), 'bench' "
    "FROM generate_series(1, :pipelines) i",
    # One batch a minute per pipeline, the newest a minute ago; ids in time order, as the real ledger has them.
    "INSERT INTO batches (pipeline_id, kind, state, attempt, staged_attempt, counts, timings, airflow_run_id, "
    "created_at, staged_at, committed_at) "
    "SELECT p.id, 'scheduled', 'committed', 1, 1, "
    "jsonb_build_object('records', 5000 + (k * 37 + p.id * 101) % 3000, 'dead_letters', (k * 13 + p.id) % 7, "
    "'late_records', (k * 11 + p.id) % 5), "
    "jsonb_build_object('plan_s', 0.2 + (k % 10) / 100.0, 'read_s', 1.5 + (k % 17) / 10.0, "
    "'stage_write_s', 0.8 + (k % 13) / 10.0, 'stage_total_s', 2.5 + (k % 17) / 10.0, "
    "'commit_s', 0.1 + (k % 7) / 100.0), "
    "'scheduled__' || k, t, t + interval '20 seconds', t + interval '30 seconds' "
    "FROM generate_series(1, :batches) k CROSS JOIN pipelines p "
    "CROSS JOIN LATERAL (SELECT now() - (:batches - k + 1) * interval '1 minute' AS t) at "
    "ORDER BY k, p.id",
    # Each batch reads [n*100, n*100 + 100) of every partition (n its index in the pipeline).
    "INSERT INTO ranges (batch_id, pipeline_id, topic, partition, start_offset, end_offset, committed) "
    "SELECT b.id, b.pipeline_id, 'bench', n, b.k * 100, b.k * 100 + 100, true "
    "FROM (SELECT id, pipeline_id, row_number() OVER (PARTITION BY pipeline_id ORDER BY id) - 1 AS k "
    "FROM batches) b CROSS JOIN generate_series(0, :partitions - 1) n ORDER BY b.id, n",
    "INSERT INTO lag_snapshots (pipeline_id, batch_id, topic, partition, start_offset, latest_offset, lag, "
    "lag_after, planned_at) "
    "SELECT b.pipeline_id, b.id, 'bench', n, b.k * 100, b.k * 100 + l.lag, l.lag, greatest(l.lag - 100, 0), "
    "b.created_at "
    "FROM (SELECT id, pipeline_id, created_at, row_number() OVER (PARTITION BY pipeline_id ORDER BY id) - 1 AS k "
    "FROM batches) b CROSS JOIN generate_series(0, :partitions - 1) n "
    "CROSS JOIN LATERAL (SELECT 100 + ((b.k * 7 + n * 31 + b.pipeline_id) % 400) AS lag) l ORDER BY b.id, n",
    "INSERT INTO positions (pipeline_id, topic, partition, next_offset, last_batch_id) "
    "SELECT p.id, 'bench', n, :batches * 100, (SELECT max(id) FROM batches b WHERE b.pipeline_id = p.id) "
    "FROM pipelines p CROSS JOIN generate_series(0, :partitions - 1) n",
    "ANALYZE",
]


def fill_ledger(url: str, pipelines: int, partitions: int, batches: int) -> dict[str, float]:
    """Fill an empty, migrated ledger; returns the seconds of each statement, keyed by its table."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    seconds: dict[str, float] = {}
    params = {"pipelines": pipelines, "partitions": partitions, "batches": batches}
    try:
        for statement in FILL:
            started = time.monotonic()
            with engine.begin() as conn:
                conn.execute(text(statement), params)
            table = statement.split()[2] if statement.startswith("INSERT") else statement.lower()
            seconds[table] = round(time.monotonic() - started, 1)
            print(f"  {table}: {seconds[table]} s", flush=True)
    finally:
        engine.dispose()
    return seconds


def closed_kafka(_connection: str) -> object:  # the bench pipelines have no spec: Kafka is never asked
    from microbatch.settings import KafkaSettings

    return KafkaSettings("127.0.0.1:9")


def time_renders(url: str, ranges: list[str], reps: int) -> list[dict]:
    """The median seconds of `reps` GET /ledger?range=R per range, as the browser asks for the page."""
    from fastapi.testclient import TestClient

    from microbatch.ui import LedgerSources, create_app

    app = create_app(LedgerSources(ledger_url=lambda: url, kafka_settings=closed_kafka, kafka_timeout_s=0.5),
                     auth=lambda: None)
    client = TestClient(app)
    client.get("/ledger")  # warm: connection pool, imports, Postgres caches
    rows = []
    for name in ranges:
        samples, size = [], 0
        for _ in range(reps):
            started = time.perf_counter()
            response = client.get(f"/ledger?range={name}")
            samples.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text[:500]
            size = len(response.content)
        rows.append({"range": name, "median_s": median(samples), "max_s": round(max(samples), 3),
                     "html_kb": round(size / 1024)})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--keep", help="a directory for the PostgreSQL data, kept (and reused when filled)")
    args = parser.parse_args(argv)
    from microbatch.dev.postgres import LocalPostgres
    from microbatch.sinks.schema import migrate

    results: dict = {"machine": machine(), "args": vars(args)}
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mb-bench-ledger-page-"))
    with LocalPostgres(work / "postgres") as server:
        server.create_database("bench_ledger_page")
        url = server.url("bench_ledger_page")
        migrate(url)
        from sqlalchemy import create_engine

        engine = create_engine(url)
        with engine.connect() as conn:
            filled = conn.execute(text("SELECT count(*) FROM pipelines")).scalar_one()
        engine.dispose()
        if not filled:
            print(f"filling {args.pipelines} pipelines x {args.partitions} partitions x {args.batches} batches")
            results["fill_s"] = fill_ledger(url, args.pipelines, args.partitions, args.batches)
        rows = time_renders(url, ["1h", "1d", "7d"], args.reps)
    results["renders"] = rows
    results["reproduce"] = reproduce_command("ledger_page.py", argv)
    print_table(f"GET /ledger, {args.pipelines} pipelines x {args.partitions} partitions x {args.batches} batches "
                f"(median of {args.reps})", ["range", "median s", "max s", "HTML KiB"],
                [[r["range"], r["median_s"], r["max_s"], r["html_kb"]] for r in rows])
    print(f"results: {write_results('ledger_page', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
