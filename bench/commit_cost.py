"""Commit cost: the duration of commit_batch vs input records (same output rows) and vs partitions.

Rows are staged directly with SQL (generate_series), so only the commit is measured: each batch
has `--rows` staged aggregate rows for ip_counts whatever its input size, its ranges cover the
input records spread over the partitions, and a first, unmeasured batch creates the positions, so
the measured commits are the steady state (compare-and-set UPDATEs). Medians of --reps commits.

A second part measures the staging bulk write itself inside spark-submit: Spark JDBC with
reWriteBatchedInserts=true (what staging.py uses), plain JDBC batches, and COPY FROM STDIN per
partition (psycopg), into stage_ip_counts.

With --explain ROWS it profiles one steady-state commit of ROWS staged rows instead: every statement the commit
runs, with PostgreSQL's auto_explain (ANALYZE, BUFFERS, nested statements) sent back as notices, so the table
shows where the commit's time goes, statement by statement.

    PYTHONPATH=include:. .venv/bin/python bench/commit_cost.py
    PYTHONPATH=include:. .venv/bin/python bench/commit_cost.py --explain 80000
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    machine,
    median,
    print_table,
    reproduce_command,
    spark_submit,
    write_results,
    write_spec,
)

TOPIC = "bench_src"
BASE = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def plan_batch_sql(url: str, spec, records: int, partitions: int) -> int:
    """The ledger's part of a plan, without Kafka: read the positions, look for an open batch, insert the
    planned batch with a range of records/partitions offsets per partition."""
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction
    from microbatch.types import OffsetRange, Plan, TopicPartition

    per_partition = -(-records // partitions)
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        positions = repo.read_positions(session, pipeline.id)
        assert not repo.find_open_batches(session, pipeline.id)
        ranges = []
        for p in range(partitions):
            start = positions.get(TopicPartition(TOPIC, p), 0)
            ranges.append(OffsetRange(TOPIC, p, start, start + per_partition))
        return repo.insert_batch(session, pipeline, Plan(ranges=tuple(ranges))).id


def stage_batch_sql(url: str, spec, batch_index: int, records: int, partitions: int, rows: int,
                    dead_share: float, batch_id: int | None = None) -> int:
    """Plan (unless `batch_id` is given) + stage one batch without Kafka or Spark: ranges, staged rows, staged
    dead letters."""
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction

    per_partition = -(-records // partitions)
    if batch_id is None:
        batch_id = plan_batch_sql(url, spec, records, partitions)
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
        window = BASE + timedelta(seconds=5 * batch_index)
        dead = int(records * dead_share)
        good = records - dead
        session.execute(text(
            "INSERT INTO stage_ip_counts (batch_id, attempt, window_start, window_end, ip, count, topic, partition) "
            "SELECT :b, :a, :ws, :we, '10.' || (i / 65536 % 256) || '.' || (i / 256 % 256) || '.' || (i % 256), "
            ":per + CASE WHEN i <= :rest THEN 1 ELSE 0 END, :t, i % :p FROM generate_series(1, :rows) AS i"),
            {"b": batch_id, "a": attempt, "ws": window, "we": window + timedelta(seconds=5), "rows": rows,
             "per": good // rows, "rest": good % rows, "t": TOPIC, "p": partitions})
        if dead:
            session.execute(text(
                'INSERT INTO stage_dead_letters (batch_id, attempt, topic, partition, "offset", raw, error) '
                "SELECT :b, :a, :t, i % :p, :base + i, convert_to(repeat('x', 100), 'UTF8'), 'not an access-log line' "
                "FROM generate_series(1, :n) AS i"),
                {"b": batch_id, "a": attempt, "t": TOPIC, "p": partitions, "n": dead, "base": batch_index * records})
        repo.record_staged(session, batch_id, attempt,
                           {"records": per_partition * partitions, "rows_by_sink": {"ip_counts": rows},
                            "dead_letters": dead, "late_records": 0}, {}, {})
    return batch_id


def commit_once(url: str, spec, batch_id: int) -> float:
    from microbatch.ledger.database import transaction
    from microbatch.phases.commit import commit_batch

    t0 = time.monotonic()
    with transaction(url) as session:
        commit_batch(session, spec, batch_id)
    return time.monotonic() - t0


AUTO_EXPLAIN = ("LOAD 'auto_explain'", "SET LOCAL auto_explain.log_min_duration = 0",
                "SET LOCAL auto_explain.log_analyze = on", "SET LOCAL auto_explain.log_buffers = on",
                "SET LOCAL auto_explain.log_nested_statements = on", "SET LOCAL auto_explain.log_level = notice",
                "SET LOCAL client_min_messages = notice")


def explained_commit(url: str, spec, batch_id: int) -> tuple[float, list[dict]]:
    """One commit with auto_explain: (seconds, one entry per statement: ms, its text, its plan)."""
    from microbatch.ledger.database import transaction
    from microbatch.phases.commit import commit_batch

    notices: list[str] = []
    t0 = time.monotonic()
    with transaction(url) as session:
        session.connection().connection.driver_connection.add_notice_handler(
            lambda diag: notices.append(diag.message_primary or ""))
        for statement in AUTO_EXPLAIN:
            session.execute(text(statement))
        commit_batch(session, spec, batch_id)
    took = time.monotonic() - t0
    statements = []
    for notice in notices:
        match = re.match(r"duration: ([\d.]+) ms\s+plan:\s*Query Text: (.*?)\n(.*)", notice, re.S)
        if match:
            statements.append({"ms": float(match.group(1)), "query": " ".join(match.group(2).split()),
                               "plan": match.group(3)})
    return took, statements


def explain_scenario(postgres, work: Path, rows: int) -> dict:
    """A first commit (it creates the positions), then one steady-state commit of `rows` staged rows over 8
    partitions, explained."""
    from microbatch.config import find_spec
    from microbatch.sinks.schema import migrate

    postgres.create_database("explain")
    url = postgres.url("explain")
    migrate(url)
    spec = find_spec("ip_count", write_spec(work / "specs" / "explain", [TOPIC], 1_000_000))
    commit_once(url, spec, stage_batch_sql(url, spec, 0, 1_000_000, 8, rows, 0.0))
    took, statements = explained_commit(url, spec, stage_batch_sql(url, spec, 1, 1_000_000, 8, rows, 0.0))
    return {"rows": rows, "commit_s": round(took, 4), "statements": statements}


def scenario(postgres, work: Path, name: str, records: int, partitions: int, rows: int, reps: int,
             dead_share: float = 0.0) -> dict:
    from microbatch.config import find_spec
    from microbatch.sinks.schema import migrate

    postgres.create_database(name)
    url = postgres.url(name)
    migrate(url)
    spec = find_spec("ip_count", write_spec(work / "specs" / name, [TOPIC], max(records, 1)))
    seconds = []
    first = None
    for i in range(reps + 1):
        batch_id = stage_batch_sql(url, spec, i, records, partitions, rows, dead_share)
        took = commit_once(url, spec, batch_id)
        if i == 0:
            first = took  # creates the positions (INSERT path); not the steady state
        else:
            seconds.append(took)
    return {"records": records, "partitions": partitions, "rows": rows, "dead_share": dead_share,
            "first_commit_s": round(first, 4), "commit_s": seconds, "median_s": median(seconds)}


def staging_write(url: str, rows: int, reps: int) -> dict:
    env = {"MICROBATCH_LEDGER_URL": url}
    result = spark_submit(APPS / "staging_write.py", [str(rows), str(reps)], env)
    return result.json_lines()[-1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000, help="staged output rows per batch")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write-rows", type=int, default=500_000, help="rows of the staging-write comparison")
    parser.add_argument("--skip-write", action="store_true")
    parser.add_argument("--explain", type=int, default=0, metavar="ROWS",
                        help="only profile one commit of ROWS staged rows with auto_explain")
    args = parser.parse_args(argv)
    if args.explain:
        return explain_main(args, argv)
    import shutil
    import tempfile

    from microbatch.dev.postgres import LocalPostgres

    work = Path(tempfile.mkdtemp(prefix="mb-bench-commit-"))
    work.chmod(0o755)
    postgres = LocalPostgres(work / "postgres")
    results: dict = {"machine": machine(), "args": vars(args)}
    try:
        postgres.start()
        by_records = [scenario(postgres, work, f"r{n}", n, 8, args.rows, args.reps)
                      for n in (10_000, 1_000_000, 10_000_000)]
        by_partitions = [scenario(postgres, work, f"p{p}", 1_000_000, p, args.rows, args.reps)
                         for p in (8, 64, 512)]
        dead = [scenario(postgres, work, f"d{n}", n, 8, args.rows, args.reps, dead_share=0.01)
                for n in (10_000, 1_000_000, 10_000_000)]
        results.update(by_records=by_records, by_partitions=by_partitions, with_1pct_dead_letters=dead)
        if not args.skip_write:
            from microbatch.sinks.schema import migrate

            postgres.create_database("write")
            migrate(postgres.url("write"))
            results["staging_write"] = staging_write(postgres.url("write"), args.write_rows, args.reps)
    finally:
        postgres.stop()
        shutil.rmtree(work, ignore_errors=True)

    flat = by_records[-1]["median_s"] / by_records[0]["median_s"]
    per_partition = [(s["median_s"] - by_partitions[0]["median_s"]) / (s["partitions"] - 8) * 1000
                     for s in by_partitions[1:]]
    results["ratio_10M_over_10k"] = round(flat, 3)
    results["ms_per_extra_partition"] = [round(v, 3) for v in per_partition]
    results["command"] = reproduce_command("commit_cost.py", argv)
    path = write_results("commit_cost", results)
    rows = [[f"{s['records']:,} rec / {s['partitions']} parts", s["rows"], s["first_commit_s"] * 1000,
             s["median_s"] * 1000] for s in by_records + by_partitions]
    rows += [[f"{s['records']:,} rec / 8 parts, 1% dead letters", s["rows"], s["first_commit_s"] * 1000,
              s["median_s"] * 1000] for s in dead]
    print_table(f"Commit duration (median of {args.reps}, steady state)",
                ["batch", "staged rows", "first commit ms", "commit ms"], rows)
    print(f"10M/10k commit ratio: {flat:.2f} (goal <= 1.2); "
          f"extra ms per partition: {results['ms_per_extra_partition']}")
    if "staging_write" in results:
        w = results["staging_write"]
        print_table(f"Staging bulk write of {args.write_rows:,} rows into stage_ip_counts (median s)",
                    ["path", "seconds", "rows/s"],
                    [[k, v, args.write_rows / v] for k, v in w["median_s"].items()])
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


def explain_main(args: argparse.Namespace, argv: list[str]) -> int:
    import shutil
    import tempfile

    from microbatch.dev.postgres import LocalPostgres

    work = Path(tempfile.mkdtemp(prefix="mb-bench-explain-"))
    work.chmod(0o755)
    postgres = LocalPostgres(work / "postgres")
    try:
        postgres.start()
        results = {"machine": machine(), "args": vars(args), **explain_scenario(postgres, work, args.explain)}
    finally:
        postgres.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["command"] = reproduce_command("commit_cost.py", argv)
    path = write_results("commit_explain", results)
    ranked = sorted(results["statements"], key=lambda st: -st["ms"])
    print_table(f"One commit of {args.explain:,} staged rows over 8 partitions: {results['commit_s'] * 1000:.0f} ms; "
                "its statements by time (auto_explain, ANALYZE + BUFFERS)", ["ms", "statement", "top plan node"],
                [[st["ms"], st["query"][:110], st["plan"].strip().splitlines()[0][:70]] for st in ranked[:12]])
    print(f"results (each statement's whole plan): {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
