"""Throughput of the `delta` sink (Delta Lake, append) beside Spark Structured Streaming writing the same table.

One run, one topic of N JSON clicks (`{"user": ..., "page": ..., "ts": ...}`, every one valid, all inside one
60-second event-time window of one day) over 8 partitions, medians of --reps runs of:
  m. microbatch: plan + stage (spark-submit spark_jobs/run_batch.py, Delta's session extension) + commit of a
     pipeline with only the `clicks_lake` delta append sink (spark_jobs/clicks.py, `partition_by: [day(ts)]`),
     one batch over the whole range; with --batch B also batches of B records. Each batch is ONE idempotent
     Delta commit (txnAppId, replaceWhere over its offset ranges) recorded in the ledger, then the ledger's commit.
  p. the peer: Structured Streaming, Trigger.AvailableNow, the same parse and output (spark_jobs/clicks.py),
     `writeStream.format("delta")` (append; Delta's own idempotent commit per micro-batch) with its own
     checkpoint; one micro-batch, and with --batch maxOffsetsPerTrigger=B.
Every run writes a new table, created from the same spec by delta-rs as `microbatch migrate` does (untimed);
after each run delta-rs (not Spark) reads the table back: N rows, N distinct (partition, offset).
"wall" rates include each process launch (JVM + Spark start); "engine" rates count only the time inside the
started application (microbatch: the stage's read + Delta write + the ledger commit; the peer: the query run).

    PYTHONPATH=include:. .venv/bin/python bench/delta_sink.py --records 1000000 --reps 3 --batch 250000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    Stack,
    end_offsets,
    event_logged,
    local_stack,
    machine,
    median,
    phase,
    print_table,
    produce,
    reproduce_command,
    spark_submit,
    spark_task_metrics,
    write_results,
)

TOPIC = "bench_clicks"
PIPELINE = "clicks_delta"
SINK = "clicks_lake"
COLUMNS = {"user": "text", "page": "text", "ts": "timestamptz"}
PARTITION_BY = ["day(ts)"]
WINDOW_START = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def clicks_payload(path: Path, lines: int = 10_000, seed: int = 19) -> Path:
    """JSON clicks, one per line, for ProducerPerformance (which picks lines at random, so event time cannot
    grow with the offset): every click valid and inside one 60-second window of one day, so no record is a
    dead letter and every produced record is one table row, whatever the batch split."""
    from microbatch.dev.datagen import format_click

    rng = random.Random(seed)
    pages = ["/"] + [f"/page/{i}" for i in range(1, 50)]
    out = [format_click(f"user-{rng.randrange(5_000):05d}", rng.choice(pages),
                        WINDOW_START + timedelta(seconds=rng.randrange(50))).decode() for _ in range(lines)]
    path.write_text("\n".join(out))
    return path


def filled_clicks_topic(stack: Stack, records: int, partitions: int) -> tuple[dict, dict[int, int]]:
    from microbatch.dev.kafka import create_topic

    create_topic(stack.bootstrap, TOPIC, partitions)
    payload = clicks_payload(stack.work_dir / "clicks.txt")
    produced = produce(stack.bootstrap, TOPIC, records, payload)
    lines = payload.read_text().splitlines()
    produced["mean_record_bytes"] = round(sum(len(line) for line in lines) / len(lines), 1)
    ends = end_offsets(stack.bootstrap, TOPIC)
    if sum(ends.values()) != records:
        raise RuntimeError(f"the topic holds {sum(ends.values())} records, expected {records}")
    return produced, ends


def sink_spec(table: Path) -> dict:
    return {"name": SINK, "type": "delta", "path": str(table), "mode": "append", "columns": COLUMNS,
            "partition_by": PARTITION_BY}


def write_delta_spec(directory: Path, table: Path, max_records: int) -> Path:
    """The clicks example reduced to its delta sink, reading the bench topic, in batches of `max_records`."""
    spec = {
        "name": PIPELINE,
        "schedule": None,
        "source": {"topics": [TOPIC], "max_records_per_batch": max_records, "commit_group_offsets": False,
                   "isolation_level": "read_committed", "on_data_loss": "fail"},
        "job": {"transform": "spark_jobs.clicks:transform",
                "options": {"window_seconds": 60, "allowed_lateness_seconds": 5}},
        "sinks": [sink_spec(table)],
        "spark": {"conf": {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    return directory


def new_table(table: Path) -> None:
    """Create the table from the sink's spec with delta-rs, as `microbatch migrate` does."""
    from microbatch.config import DeltaSink
    from microbatch.sinks.delta import migrate_table

    migrate_table(DeltaSink.model_validate(sink_spec(table)))


def check_table(name: str, table: Path, records: int) -> dict:
    """The table read back by delta-rs (no Spark): exactly `records` rows, each (partition, offset) once."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(table))
    coordinates = dt.to_pyarrow_table(columns=["partition", "offset"])
    distinct = coordinates.group_by(["partition", "offset"]).aggregate([]).num_rows
    if coordinates.num_rows != records or distinct != records:
        raise RuntimeError(f"{name}: the Delta table {table} holds {coordinates.num_rows} rows "
                           f"({distinct} distinct coordinates), expected {records}")
    return {"rows": coordinates.num_rows, "version": dt.version(), "files": len(dt.file_uris())}


def microbatch_run(stack: Stack, name: str, records: int, per_batch: int, driver_memory: str) -> dict:
    """plan -> stage -> commit until caught up, on a fresh ledger and a fresh table; every phase timed."""
    from microbatch.config import find_spec
    from microbatch.ledger.database import transaction
    from microbatch.sinks import delta

    url = stack.fresh_ledger(name)
    table = stack.work_dir / "warehouse" / name
    spec_dir = write_delta_spec(stack.work_dir / "specs" / name, table, per_batch)
    env = {"MICROBATCH_LEDGER_URL": url, "MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap,
           "MICROBATCH_PIPELINES_DIR": str(spec_dir), delta.WAREHOUSE_ENV: str(stack.work_dir / "warehouse")}
    spec = find_spec(PIPELINE, spec_dir)
    new_table(table)
    # What the stage task submits with (operators.submit_conf): Delta's session extension, then the spec's conf.
    events = stack.work_dir / "events" / name
    conf = {**delta.SPARK_SESSION_CONF, **spec.spark.conf, **event_logged(events)}
    totals = {"plan_s": 0.0, "stage_wall_s": 0.0, "commit_s": 0.0, "batches": 0}
    peak_stage_tree = 0.0
    committed_rows = 0
    while True:
        plan, _ = phase("plan", env, PIPELINE)
        if plan["batch_id"] is None:
            break
        stage = spark_submit(APPS / "stage_entry.py", ["--pipeline", PIPELINE, "--batch-id", str(plan["batch_id"])],
                             env, conf=conf, driver_memory=driver_memory)
        peak_stage_tree = max(peak_stage_tree, stage.peak_rss_mb.get("tree", 0.0))
        commit, _ = phase("commit", env, PIPELINE, str(plan["batch_id"]))
        committed_rows += int(commit["rows_by_sink"].get(SINK) or 0)
        totals["plan_s"] += plan["seconds"]
        totals["stage_wall_s"] += stage.seconds
        totals["commit_s"] += commit["transaction_s"]
        totals["batches"] += 1
    with transaction(url) as session:
        timings = session.execute(text("SELECT timings FROM batches ORDER BY id")).scalars().all()
        versions = session.execute(text("SELECT count(*) FROM lake_commits")).scalar_one()
    if committed_rows != records or versions != totals["batches"]:
        raise RuntimeError(f"{name}: the ledger committed {committed_rows} rows in {versions} table versions, "
                           f"expected {records} in {totals['batches']}")
    # read_s is the stage's one pass: read, parse, and the Delta commit of the batch (sinks/delta.write_batch).
    totals["read_and_delta_write_s"] = sum(t.get("read_s", 0) for t in timings)
    totals["stage_engine_s"] = totals["read_and_delta_write_s"] + sum(t.get("stage_write_s", 0) for t in timings)
    wall = totals["plan_s"] + totals["stage_wall_s"] + totals["commit_s"]
    engine = totals["stage_engine_s"] + totals["commit_s"]
    return {**{k: round(v, 3) for k, v in totals.items()}, "wall_s": round(wall, 3), "engine_s": round(engine, 3),
            "table": check_table(name, table, records), "peak_stage_rss_mb": peak_stage_tree,
            "spark_metrics": spark_task_metrics(events) if events.exists() else {}}


def peer_run(stack: Stack, name: str, records: int, max_offsets: int, driver_memory: str) -> dict:
    from microbatch.sinks import delta

    table = stack.work_dir / "warehouse" / name
    new_table(table)
    checkpoint = stack.work_dir / "checkpoints" / name
    events = stack.work_dir / "events" / name
    conf = {**delta.SPARK_SESSION_CONF, "spark.sql.shuffle.partitions": "4", **event_logged(events)}
    result = spark_submit(APPS / "peer_delta.py", [TOPIC, str(checkpoint), str(table), str(max_offsets)],
                          {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap}, conf=conf, driver_memory=driver_memory)
    info = result.json_lines()[-1]
    if info["records"] != records:
        raise RuntimeError(f"{name}: the peer read {info['records']} records, expected {records}")
    return {"wall_s": round(result.seconds, 3), "engine_s": info["query_s"], "batches": info["batches"],
            "table": check_table(name, table, records), "peak_rss_mb": result.peak_rss_mb.get("tree", 0.0),
            "spark_metrics": spark_task_metrics(events)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=0,
                        help="also run batches of this many records (microbatch) / maxOffsetsPerTrigger (peer)")
    parser.add_argument("--batch-reps", type=int, default=None, help="reps of the --batch runs (default --reps)")
    parser.add_argument("--driver-memory", default="1g", help="spark-submit --driver-memory (Spark's default: 1g)")
    args = parser.parse_args(argv)
    n = args.records
    batch_reps = args.reps if args.batch_reps is None else args.batch_reps
    results: dict = {"machine": machine(), "args": vars(args), "runs": {}}
    runs = results["runs"]
    started = time.monotonic()
    with local_stack("mb-bench-delta-") as stack:
        results["produce"], results["partition_sizes"] = filled_clicks_topic(stack, n, args.partitions)
        print(f"produced {n:,} clicks in {results['produce']['seconds']}s; measuring...", flush=True)
        for rep in range(args.reps):
            runs.setdefault("m_microbatch_1_batch", []).append(
                microbatch_run(stack, f"m1_{rep}", n, n, args.driver_memory))
            runs.setdefault("p_peer_1_batch", []).append(peer_run(stack, f"p1_{rep}", n, 0, args.driver_memory))
            if args.batch and rep < batch_reps:
                runs.setdefault("m_microbatch_batches", []).append(
                    microbatch_run(stack, f"mb_{rep}", n, args.batch, args.driver_memory))
                runs.setdefault("p_peer_batches", []).append(
                    peer_run(stack, f"pb_{rep}", n, args.batch, args.driver_memory))
            write_results("delta_sink_partial", results)  # a long run that dies later keeps its finished reps
            print(f"rep {rep + 1}/{args.reps} done ({time.monotonic() - started:.0f}s)", flush=True)

    summary: dict[str, dict] = {}
    for key, values in runs.items():
        wall, engine = median([v["wall_s"] for v in values]), median([v["engine_s"] for v in values])
        summary[key] = {"reps": len(values), "batches": values[0]["batches"], "wall_s": wall, "engine_s": engine,
                        "wall_rate": round(n / wall), "engine_rate": round(n / engine)}
    results["summary"] = summary
    ratios = {}
    for label, m, p in (("microbatch/peer, 1 batch", "m_microbatch_1_batch", "p_peer_1_batch"),
                        (f"microbatch/peer, batches of {args.batch:,}", "m_microbatch_batches", "p_peer_batches")):
        if m in summary and p in summary:
            ratios[label] = {"wall": round(summary[m]["wall_rate"] / summary[p]["wall_rate"], 3),
                             "engine": round(summary[m]["engine_rate"] / summary[p]["engine_rate"], 3)}
    results["ratios"] = ratios
    phase_keys = ("plan_s", "stage_wall_s", "stage_engine_s", "read_and_delta_write_s", "commit_s")
    results["phases_microbatch_median"] = {
        key: {k: median([r[k] for r in runs[key]]) for k in phase_keys}
        for key in ("m_microbatch_1_batch", "m_microbatch_batches") if key in runs}
    results["command"] = reproduce_command("delta_sink.py", argv)
    results["seconds"] = round(time.monotonic() - started, 1)
    path = write_results("delta_sink", results)

    print_table(f"Delta append sink, {n:,} JSON clicks over {args.partitions} partitions (medians)",
                ["run", "reps", "batches", "wall s", "wall rec/s", "engine s", "engine rec/s"],
                [[k, s["reps"], s["batches"], s["wall_s"], s["wall_rate"], s["engine_s"], s["engine_rate"]]
                 for k, s in summary.items()])
    print_table("Ratios (records/s of microbatch over the peer)", ["ratio", "wall", "engine"],
                [[k, v["wall"], v["engine"]] for k, v in ratios.items()])
    print_table("microbatch phases (medians, s)", ["run", *phase_keys],
                [[key, *v.values()] for key, v in results["phases_microbatch_median"].items()])
    spark_rows = []
    for key, values in runs.items():
        metrics = [r["spark_metrics"] for r in values if r.get("spark_metrics")]
        if metrics:
            m = {k: median([x[k] for x in metrics]) for k in metrics[0]}
            spark_rows.append([key, m["stages"], m["tasks"], m["run_s"], m["cpu_s"], m["gc_s"],
                               round(m["cpu_s"] / n * 1e6, 2)])
    results["spark_metrics_median"] = spark_rows
    write_results("delta_sink", results)
    print_table("Spark task metrics (event log, summed over tasks, medians)",
                ["run", "stages", "tasks", "run s", "CPU s", "GC s", "CPU µs/record"], spark_rows)
    print(f"tables checked by delta-rs after every run: {n:,} rows each; results in {path}")
    print(f"reproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
