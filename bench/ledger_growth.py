"""Cost as the ledger grows (issue 22, goal 6): the ledger's work of one batch, on an empty ledger and on one that
holds --ranges committed ranges of history, in one run on one PostgreSQL server.

The history is written by SQL (a generator, as the issue allows): --pipelines other pipelines with --partitions
partitions each, and the measured pipeline's own --own-batches batches over its 8 partitions, every batch
committed with one range per partition and the positions at the end. Then ANALYZE, as autovacuum would.

Per ledger, medians of --reps:
- plan: the ledger's part of a plan (positions, the open-batch check, the planned batch and its ranges);
- commit: `commit_batch` of that batch with --rows staged ip_counts rows (staged by SQL, as bench/commit_cost.py);
- verify: what `microbatch verify` reads and checks for the pipeline (committed ranges, gaps, positions, then
  the overlap and hole checks);
- status: `microbatch status`'s ledger query for the pipeline.
Kafka and Spark are not involved: only what grows with the ledger is measured.

    PYTHONPATH=include:. .venv/bin/python bench/ledger_growth.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from commit_cost import TOPIC, commit_once, plan_batch_sql, stage_batch_sql
from common import machine, median, print_table, reproduce_command, write_results, write_spec

PARTITIONS = 8
RECORDS = 100_000
STEP = 100
"""Offsets per range in the generated history."""


def fill_history(url: str, pipeline_id: int, own_batches: int, pipelines: int, partitions: int,
                 ranges: int) -> dict[str, int]:
    """Committed history: the measured pipeline's own batches, then other pipelines up to `ranges` ranges."""
    from microbatch.ledger.database import transaction

    others = max(0, ranges - own_batches * PARTITIONS)
    per_pipeline = -(-others // (pipelines * partitions))  # batches of each other pipeline
    with transaction(url) as session:
        session.execute(text("INSERT INTO pipelines (name, spec_hash) SELECT 'filler_' || i, 'generated' "
                             "FROM generate_series(1, :n) AS i"), {"n": pipelines})
        others_ids = session.execute(text("SELECT id FROM pipelines WHERE name LIKE 'filler\\_%' ORDER BY id"))
        fillers = [pipeline_id, *others_ids.scalars()]
    for pid in fillers:
        own = pid == pipeline_id
        batches, parts, topic = (own_batches, PARTITIONS, TOPIC) if own else (per_pipeline, partitions, "filler")
        with transaction(url) as session:
            session.execute(text(
                "INSERT INTO batches (pipeline_id, kind, state, attempt, staged_attempt, committed_at, staged_at) "
                "SELECT :p, 'scheduled', 'committed', 1, 1, now(), now() FROM generate_series(1, :b)"),
                {"p": pid, "b": batches})
            session.execute(text(
                "INSERT INTO ranges (batch_id, pipeline_id, topic, partition, start_offset, end_offset, committed) "
                "SELECT b.id, b.pipeline_id, :t, part, (b.k - 1) * :step, b.k * :step, true FROM "
                "(SELECT id, pipeline_id, row_number() OVER (ORDER BY id) AS k FROM batches WHERE pipeline_id = :p) b "
                "CROSS JOIN generate_series(0, :parts - 1) AS part"),
                {"p": pid, "t": topic, "parts": parts, "step": STEP})
            session.execute(text(
                "INSERT INTO positions (pipeline_id, topic, partition, next_offset, last_batch_id) "
                "SELECT :p, :t, part, CAST(:b AS bigint) * :step, (SELECT max(id) FROM batches WHERE pipeline_id = :p) "
                "FROM generate_series(0, :parts - 1) AS part"),
                {"p": pid, "t": topic, "parts": parts, "b": batches, "step": STEP})
    with transaction(url) as session:
        session.execute(text("ANALYZE"))
        counts = session.execute(text(
            "SELECT (SELECT count(*) FROM ranges), (SELECT count(*) FROM batches), (SELECT count(*) FROM pipelines)")
        ).one()
    return {"ranges": counts[0], "batches": counts[1], "pipelines": counts[2]}


def verify_once(url: str, pipeline_id: int) -> tuple[float, int]:
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction
    from microbatch.planning import find_holes, find_overlaps

    t0 = time.monotonic()
    with transaction(url) as session:
        ranges = repo.committed_ranges(session, pipeline_id)
        gaps = repo.committed_gaps(session, pipeline_id)
        positions = repo.read_positions(session, pipeline_id)
    problems = [*find_overlaps(ranges), *find_holes(ranges, gaps, positions)]
    assert not problems, problems[:3]
    return time.monotonic() - t0, len(ranges)


def status_once(url: str, pipeline_id: int) -> float:
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction

    t0 = time.monotonic()
    with transaction(url) as session:
        assert queries.partition_status(session, pipeline_id)
    return time.monotonic() - t0


def measure(url: str, spec, reps: int, rows: int, start_index: int) -> dict:
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction

    with transaction(url) as session:
        pipeline_id = repo.ensure_pipeline(session, spec).id
    plan_s, commit_s, verify_s, status_s, verified = [], [], [], [], 0
    for i in range(reps + 1):
        t0 = time.monotonic()
        batch_id = plan_batch_sql(url, spec, RECORDS, PARTITIONS)
        planned = time.monotonic() - t0
        stage_batch_sql(url, spec, start_index + i, RECORDS, PARTITIONS, rows, 0.0, batch_id=batch_id)
        committed = commit_once(url, spec, batch_id)
        took, verified = verify_once(url, pipeline_id)
        status = status_once(url, pipeline_id)
        if i == 0:
            continue  # warms the connection pool and the caches; positions exist on both ledgers by now
        plan_s.append(planned)
        commit_s.append(committed)
        verify_s.append(took)
        status_s.append(status)
    return {"plan_s": plan_s, "commit_s": commit_s, "verify_s": verify_s, "status_s": status_s,
            "verified_ranges": verified, "median": {"plan": median(plan_s), "commit": median(commit_s),
                                                     "verify": median(verify_s), "status": median(status_s)}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranges", type=int, default=1_000_000, help="committed ranges of history")
    parser.add_argument("--pipelines", type=int, default=100, help="other pipelines holding the history")
    parser.add_argument("--partitions", type=int, default=10, help="partitions of each other pipeline")
    parser.add_argument("--own-batches", type=int, default=10_000, help="the measured pipeline's own batches")
    parser.add_argument("--rows", type=int, default=10_000, help="staged output rows per batch")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    from microbatch.config import find_spec
    from microbatch.dev.postgres import LocalPostgres
    from microbatch.sinks.schema import migrate

    work = Path(tempfile.mkdtemp(prefix="mb-bench-growth-"))
    work.chmod(0o755)  # the embedded PostgreSQL may run as its own system user
    postgres = LocalPostgres(work / "postgres")
    results: dict = {"machine": machine(), "args": vars(args)}
    try:
        postgres.start()
        spec = find_spec("ip_count", write_spec(work / "specs", [TOPIC], RECORDS))
        urls = {}
        for name in ("empty", "full"):
            postgres.create_database(name)
            urls[name] = postgres.url(name)
            migrate(urls[name])
        from microbatch.ledger import repository as repo
        from microbatch.ledger.database import transaction

        with transaction(urls["full"]) as session:
            own_id = repo.ensure_pipeline(session, spec).id
        t0 = time.monotonic()
        results["history"] = fill_history(urls["full"], own_id, args.own_batches, args.pipelines, args.partitions,
                                          args.ranges)
        results["history"]["fill_s"] = round(time.monotonic() - t0, 1)
        # Alternate the two ledgers rep by rep would mix their caches; each runs its reps after a warm-up.
        results["empty"] = measure(urls["empty"], spec, args.reps, args.rows, 0)
        results["full"] = measure(urls["full"], spec, args.reps, args.rows, args.own_batches)
    finally:
        postgres.stop()
        shutil.rmtree(work, ignore_errors=True)

    empty, full = results["empty"]["median"], results["full"]["median"]
    results["ratio_full_over_empty"] = {k: round(full[k] / empty[k], 3) for k in empty}
    results["command"] = reproduce_command("ledger_growth.py", argv)
    path = write_results("ledger_growth", results)
    goals = {"plan": "<= 1.1x", "commit": "<= 1.1x", "verify": "<= 10 s", "status": "<= 1 s"}
    print_table(
        f"The ledger's work of one batch (median of {args.reps}): empty ledger vs {results['history']['ranges']:,} "
        f"committed ranges ({results['history']['pipelines']} pipelines, {results['history']['batches']:,} batches)",
        ["step", "empty ms", "full ms", "full / empty", "goal"],
        [[k, empty[k] * 1000, full[k] * 1000, results["ratio_full_over_empty"][k], goals[k]] for k in empty])
    print(f"verify checked {results['full']['verified_ranges']:,} committed ranges of the measured pipeline on the "
          f"full ledger; history written in {results['history']['fill_s']} s")
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
