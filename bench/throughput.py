"""Throughput of microbatch against Kafka's own consumer, a raw Spark read and the Structured Streaming peer.

One run, one topic of N access-log records (~105 bytes) over 8 partitions, medians of --reps runs of:
  a. Kafka ConsumerPerformance reading the topic (the physical limit);
  b. spark-submit of a raw Spark read of the same ranges with count() (the Spark limit);
  b2. the same job's Spark work with no ledger: read, parse, aggregate, written to Spark's `noop` sink (the
      bare job: c/b2 is what exactly-once costs over it);
  c. microbatch plan + stage (spark-submit spark_jobs/run_batch.py) + commit of ip_count, one batch over
     the whole range, and batches of N/--split;
  d. the peer: Structured Streaming, Trigger.AvailableNow, same parse + window aggregation, foreachBatch
     JDBC into staging + merge transaction, own checkpoint; one micro-batch, and maxOffsetsPerTrigger=N/--split.
"wall" rates include each process launch (JVM + Spark start); "engine" rates count only the time inside
the already-started application (tool fetch rate, count(), stage + commit, query run).
With --connect, one long-lived Spark Connect server (microbatch's `spark.mode: connect`) also runs, warmed by one
full read first:
  b'. the raw read + count() of the same ranges through a Connect client (the Spark limit on a warm JVM);
  b2o. b2 with the stage's observed metrics (records per partition, dead letters, late records, watermark);
  b2'. the bare job through a Connect client;
  b2_split, b2'_split. b2 and b2' in batches of N/--split (planned as microbatch plans them), one after the other in
      one application: d_split/b2_split is how close the peer already is to its own Spark work in batches, so
      1/(d/b2) bounds what any engine running this job could reach against the peer;
  c'. microbatch plan + stage (a Connect client process, bench/connect_stage.py) + commit, one batch, and
      batches of N/--split; every stage process reattaches to the DAG's shared server-side session, as the
      Airflow stage task does;
  c'f. c' in batches, each stage in a new server-side session (what the stage task did before 2026-11-26);
  c_run, c'_run, c'w_run. c, c' and c'w in batches of N/--split, all planned by one run (`source.max_batches_per_run`),
      staged in one stage process (one spark-submit, or one Connect client) and committed in order, one
      transaction each;
  c_pb, c'_pb, c_run_pb, c'w_run_pb. c, c', c_run and c'w_run with the sink's `contributions: per_batch` (one
      staged row and contribution per key and batch, not per key and source partition);
  c'w. c' in batches, each of plan, stage and commit in a process forked from a forkserver that imported
      `microbatch.airflow.preload`, as the local stack's Airflow starts its tasks, instead of a new Python process;
  every Connect run of b', b2' and d' likewise reattaches to one server-side session of its own kind, so that
  all of them meet on the same warm server in warm sessions.
  d'. the peer's same query as a Connect client of the same warm server (Structured Streaming over Spark
      Connect; foreachBatch runs in the server's Python worker), one micro-batch and maxOffsetsPerTrigger=N/--split.
Peak RSS (psutil sampling of the process tree) of the stage spark-submit and of plan / commit is recorded.
Profiles: every spark-submit run (b, c, d) writes a Spark event log, whose task metrics (run, CPU, GC time, shuffle:
what the Spark UI's stage pages show) are summed per run; py-spy records the Python process of each of c's plan,
stage driver and commit (Python CPU, imports, top functions).

    PYTHONPATH=include:. .venv/bin/python bench/throughput.py --records 10000000 --reps 3 --split 10 --connect
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    BY_BATCH_TABLE,
    PYTHON,
    ROOT,
    Stack,
    create_peer_tables,
    event_logged,
    filled_topic,
    kafka_tool,
    local_stack,
    machine,
    median,
    phase,
    print_table,
    py_spy_summary,
    reproduce_command,
    run_sampled,
    spark_env,
    spark_submit,
    spark_task_metrics,
    warm_task,
    write_results,
    write_spec,
)

TOPIC = "bench_src"


def consumer_perf(stack: Stack, records: int) -> dict:
    t0 = time.monotonic()
    out = kafka_tool("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", stack.bootstrap,
                     "--topic", TOPIC, "--messages", str(records), "--timeout", "120000",
                     "--fetch-size", str(4 * 2**20)).stdout
    wall = time.monotonic() - t0
    lines = [line for line in out.splitlines() if line.strip()]
    header = [h.strip() for h in lines[0].split(",")]
    values = dict(zip(header, [v.strip() for v in lines[-1].split(",")], strict=False))
    consumed = int(values["data.consumed.in.nMsg"])
    if consumed < records:
        raise RuntimeError(f"ConsumerPerformance read {consumed} of {records} records")
    return {"wall_s": round(wall, 3), "engine_rate": float(values["nMsg.sec"]),
            "fetch_rate": float(values["fetch.nMsg.sec"]), "records": consumed}


def raw_spark(stack: Stack, name: str, ranges_file: Path, records: int, driver_memory: str) -> dict:
    events = stack.work_dir / "events" / name
    result = spark_submit(APPS / "raw_count.py", [str(ranges_file)], {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap},
                          conf=event_logged(events), driver_memory=driver_memory)
    info = result.json_lines()[-1]
    if info["count"] != records:
        raise RuntimeError(f"raw count {info['count']} != {records}")
    return {"wall_s": round(result.seconds, 3), "engine_s": info["count_s"], "peak_rss_mb": result.peak_rss_mb,
            "spark_metrics": spark_task_metrics(events)}


def bare_job(stack: Stack, name: str, ranges_file: Path, driver_memory: str, remote: str | None = None,
             observed: bool = False, batch_records: int = 0) -> dict:
    """b2 (spark-submit) or b2' (a Connect client of `remote`): read, parse, aggregate, `noop` sink; `observed`
    (b2o) adds the stage's observed metrics; `batch_records` (b2_split, b2'_split) runs the job once per batch of
    that many records, planned as microbatch plans them, in one application."""
    env = {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap}
    extra = (["observed"] if observed else []) + (["--batch-records", str(batch_records)] if batch_records else [])
    if remote:
        result = run_sampled([PYTHON, str(APPS / "bare_job.py"), str(ranges_file), *extra],
                             env={**spark_env(bootstrap=stack.bootstrap), "SPARK_REMOTE": remote})
        if result.returncode != 0:
            raise RuntimeError(f"{name}: the bare job over Spark Connect failed:\n{result.stderr[-3000:]}")
        metrics = {}
    else:
        events = stack.work_dir / "events" / name
        result = spark_submit(APPS / "bare_job.py", [str(ranges_file), *extra], env,
                              conf={"spark.sql.shuffle.partitions": "4", **event_logged(events)},
                              driver_memory=driver_memory)
        metrics = spark_task_metrics(events)
    info = result.json_lines()[-1]
    return {"wall_s": round(result.seconds, 3), "engine_s": info["job_s"], "peak_rss_mb": result.peak_rss_mb,
            "spark_metrics": metrics, "batch_job_s": info["batch_job_s"]}


def gc_logged(path: Path) -> dict[str, str]:
    """spark-submit conf that logs the driver JVM's garbage collections to `path` (UTC as usual)."""
    return {"spark.driver.extraJavaOptions": f"-Duser.timezone=UTC -Xlog:gc:file={path}"}


def live_heap_mb(gc_log: Path) -> float:
    """The largest heap occupancy right after a collection: what the driver JVM (which in local mode also
    hosts the executor) really holds, unlike its RSS, which grows toward -Xmx with garbage too."""
    after = [float(m.group(1)) for m in re.finditer(r"->(\d+)M\(\d+M\)", gc_log.read_text(errors="replace"))]
    return max(after, default=0.0)


def raw_connect(stack: Stack, ranges_file: Path, records: int, remote: str) -> dict:
    """b': raw_count.py as a plain Python Connect client of the warm server."""
    result = run_sampled([PYTHON, str(APPS / "raw_count.py"), str(ranges_file)],
                         env={**spark_env(bootstrap=stack.bootstrap), "SPARK_REMOTE": remote})
    if result.returncode != 0:
        raise RuntimeError(f"raw count over Spark Connect failed:\n{result.stderr[-3000:]}")
    info = result.json_lines()[-1]
    if info["count"] != records:
        raise RuntimeError(f"raw count {info['count']} != {records}")
    return {"wall_s": round(result.seconds, 3), "engine_s": info["count_s"], "peak_rss_mb": result.peak_rss_mb}


def microbatch_run(stack: Stack, name: str, records: int, per_batch: int, driver_memory: str,
                   remote: str | None = None, fresh_session: bool = False, warm_tasks: bool = False,
                   batches_per_run: int = 1, contributions: str = "per_partition") -> dict:
    """plan -> stage -> commit until caught up, on a fresh ledger; every phase timed and RSS-sampled.
    With `remote`, the stage is a Spark Connect client of that server instead of a spark-submit (with
    `fresh_session`, in a new server-side session per batch; with `warm_tasks`, each phase in a process forked
    from a forkserver that preloaded `microbatch.airflow.preload`, as the local stack's Airflow runs its tasks,
    instead of a new Python process; those are not RSS-sampled). With `batches_per_run` > 1, each run plans up to
    that many batches (`source.max_batches_per_run`), stages them in one stage process and commits them in order.
    With `contributions` per_batch, the sink keeps one contribution per key and batch (BY_BATCH_TABLE)."""
    from microbatch.sinks.schema import migrate_sinks

    url = stack.fresh_ledger(name)
    spec_dir = write_spec(stack.work_dir / "specs" / name, [TOPIC], per_batch, batches_per_run=batches_per_run,
                          contributions=contributions)
    migrate_sinks(url, spec_dir)
    table = BY_BATCH_TABLE if contributions == "per_batch" else "ip_counts"
    env = {"MICROBATCH_LEDGER_URL": url, "MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap,
           "MICROBATCH_PIPELINES_DIR": str(spec_dir)}
    from microbatch.config import find_spec

    spec = find_spec("ip_count", spec_dir)
    totals = {"plan_s": 0.0, "stage_wall_s": 0.0, "stage_engine_s": 0.0, "commit_s": 0.0, "batches": 0}
    peaks: dict[str, float] = {}
    events = stack.work_dir / "events" / name
    profiles = stack.work_dir / "py-spy" / name
    profiles.mkdir(parents=True, exist_ok=True)
    while True:
        if warm_tasks:
            plan, plan_wall = warm_task("phase", ["plan", "ip_count"], env)
            if plan["batch_id"] is None:
                break
            _, stage_wall = warm_task("connect_stage", ["ip_count", ",".join(str(b) for b in plan["batch_ids"])],
                                      {**env, "SPARK_REMOTE": str(remote)})
            for batch_id in plan["batch_ids"]:
                commit, _ = warm_task("phase", ["commit", "ip_count", str(batch_id)], env)
                totals["commit_s"] += commit["transaction_s"]
                totals["batches"] += 1
            totals["plan_s"] += plan["seconds"]
            totals["stage_wall_s"] += stage_wall
            totals["task_wall_s"] = totals.get("task_wall_s", 0.0) + plan_wall + stage_wall
            continue
        plan, plan_proc = phase("plan", env, "ip_count", py_spy=profiles / f"plan-{totals['batches']}.txt")
        peaks["plan_tree"] = max(peaks.get("plan_tree", 0), plan_proc.peak_rss_mb.get("tree", 0))
        if plan["batch_id"] is None:
            break
        batch_ids = ",".join(str(b) for b in plan["batch_ids"])
        if remote:
            stage = run_sampled([PYTHON, str(ROOT / "bench" / "connect_stage.py"), "ip_count", batch_ids,
                                 *(["fresh"] if fresh_session else [])],
                                env={**spark_env(), **env, "SPARK_REMOTE": remote})
            if stage.returncode != 0:
                raise RuntimeError(f"{name}: the Connect stage failed:\n{stage.stderr[-3000:]}")
        else:
            gc_log = stack.work_dir / f"gc-{name}-{plan['batch_id']}.log"
            stage = spark_submit(APPS / "stage_entry.py",
                                 ["--pipeline", "ip_count", "--batch-id", batch_ids], env,
                                 conf={**spec.spark.conf, **gc_logged(gc_log), **event_logged(events)},
                                 driver_memory=driver_memory, py_spy=profiles / f"stage-{plan['batch_id']}.txt")
            heap = live_heap_mb(gc_log)
            peaks["stage_jvm_heap_after_gc"] = max(peaks.get("stage_jvm_heap_after_gc", 0), heap)
        for kind, rss in stage.peak_rss_mb.items():
            peaks[f"stage_{kind}"] = max(peaks.get(f"stage_{kind}", 0), rss)
        for batch_id in plan["batch_ids"]:
            commit, commit_proc = phase("commit", env, "ip_count", str(batch_id),
                                        py_spy=profiles / f"commit-{batch_id}.txt")
            peaks["commit_tree"] = max(peaks.get("commit_tree", 0), commit_proc.peak_rss_mb.get("tree", 0))
            totals["commit_s"] += commit["transaction_s"]
            totals["batches"] += 1
        totals["plan_s"] += plan["seconds"]
        totals["stage_wall_s"] += stage.seconds
        totals["runs"] = totals.get("runs", 0) + 1
    from microbatch.ledger.database import transaction

    with transaction(url) as session:
        timings = session.execute(text("SELECT timings FROM batches ORDER BY id")).scalars().all()
        counted = session.execute(text(f"SELECT coalesce(sum(count), 0) FROM {table}")).scalar_one()
        rows = session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
    if counted != records:
        raise RuntimeError(f"{name}: the sink counts {counted} records, expected {records}")
    totals["read_s"] = sum(t.get("read_s", 0) for t in timings)
    batch_job_s = [round(t.get("read_s", 0) + t.get("stage_write_s", 0), 3) for t in timings]
    totals["stage_write_s"] = sum(t.get("stage_write_s", 0) for t in timings)
    # staging.py adds stage_total_s to its result after record_staged, so the ledger holds only
    # read_s and stage_write_s: the engine time of the stage is their sum.
    totals["stage_engine_s"] = totals["read_s"] + totals["stage_write_s"]
    wall = totals["plan_s"] + totals["stage_wall_s"] + totals["commit_s"]
    engine = totals["stage_engine_s"] + totals["commit_s"]
    python = {kind: [py_spy_summary(f) for f in sorted(profiles.glob(f"{kind}-*.txt"))]
              for kind in ("plan", "stage", "commit")}
    return {**{k: round(v, 3) for k, v in totals.items()}, "wall_s": round(wall, 3), "engine_s": round(engine, 3),
            "sink_rows": rows, "peak_rss_mb": peaks, "batch_job_s": batch_job_s,
            "spark_metrics": spark_task_metrics(events) if events.exists() else {},
            "python_cpu_s": {kind: round(sum(p["active_s"] for p in ps), 3) for kind, ps in python.items()},
            "python_import_s": {kind: round(sum(p["import_s"] for p in ps), 3) for kind, ps in python.items()},
            "python_top": {kind: max(ps, key=lambda p: p["active_s"])["top"] if ps else []
                           for kind, ps in python.items()}}


def peer_run(stack: Stack, name: str, records: int, max_offsets: int, driver_memory: str,
             remote: str | None = None) -> dict:
    """d: the peer as its own spark-submit; d' (`remote`): the same query as a client of the warm Connect server."""
    from microbatch.ledger.database import transaction

    stack.postgres.create_database(name)
    url = stack.postgres.url(name)
    create_peer_tables(url)
    checkpoint = stack.work_dir / "checkpoints" / name
    events = stack.work_dir / "events" / name
    env = {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap, "MICROBATCH_LEDGER_URL": url}
    if remote:
        result = run_sampled([PYTHON, str(APPS / "peer_stream.py"), TOPIC, str(checkpoint), str(max_offsets)],
                             env={**spark_env(), **env, "SPARK_REMOTE": remote})
        if result.returncode != 0:
            raise RuntimeError(f"{name}: the peer over Spark Connect failed:\n{result.stderr[-3000:]}")
    else:
        result = spark_submit(APPS / "peer_stream.py", [TOPIC, str(checkpoint), str(max_offsets)], env,
                              conf={"spark.sql.shuffle.partitions": "4", **event_logged(events)},
                              driver_memory=driver_memory)
    info = result.json_lines()[-1]
    with transaction(url) as session:
        counted = session.execute(text("SELECT coalesce(sum(count), 0) FROM peer_ip_counts")).scalar_one()
    if counted != records or info["records"] != records:
        raise RuntimeError(f"{name}: the peer counted {counted} of {info['records']} records, expected {records}")
    # Each micro-batch's foreachBatch: its Spark job and JDBC write, then its merge (not kept over Connect).
    batch_s = [round(b["stage_s"] + b["merge_s"], 3) for b in info["batches"] if "stage_s" in b]
    return {"wall_s": round(result.seconds, 3), "engine_s": info["query_s"], "batches": len(info["batches"]),
            "batch_job_s": batch_s,
            "peak_rss_mb": result.peak_rss_mb, "spark_metrics": spark_task_metrics(events) if events.exists() else {}}


def warm(remote: str | None, kind: str) -> str | None:
    """`remote` naming one server-side session per kind of Connect run (the peer, the bare job, the raw read), which
    every repetition reattaches to: each run's session is as warm as microbatch's stage tasks' shared session (a
    long-lived peer application keeps its session too), so the medians compare the same warm server and session."""
    if remote is None:
        return None
    from microbatch.spark_remote import shared_session_id, with_session_id

    return with_session_id(remote, shared_session_id(f"bench-{kind}", {}, 0))


def rep_plan(stack: Stack, args: argparse.Namespace, rep: int, split: bool, ranges_file: Path,
             remote: str | None) -> list[tuple[str, bool, Callable[[], dict]]]:
    """One repetition's runs, in order: (run, whether it runs in this rep, the measurement). Runs compared in a
    ratio sit next to each other, so that a machine whose speed drifts during a rep skews them alike."""
    n = args.records
    per = -(-n // args.split)
    peer_remote, bare_remote, raw_remote = (warm(remote, kind) for kind in ("peer", "bare", "raw"))
    return [
        ("a_kafka_consumer", True, lambda: consumer_perf(stack, n)),
        ("b_spark_raw_count", True, lambda: raw_spark(stack, f"b_{rep}", ranges_file, n, args.driver_memory)),
        ("b2_bare_job", True, lambda: bare_job(stack, f"b2_{rep}", ranges_file, args.driver_memory)),
        ("b2o_bare_job_observed", True,
         lambda: bare_job(stack, f"b2o_{rep}", ranges_file, args.driver_memory, observed=True)),
        ("c_microbatch_1_batch", True, lambda: microbatch_run(stack, f"c1_{rep}", n, n, args.driver_memory)),
        ("c_microbatch_1_batch_pb", True,
         lambda: microbatch_run(stack, f"c1pb_{rep}", n, n, args.driver_memory, contributions="per_batch")),
        ("d_peer_1_batch", True, lambda: peer_run(stack, f"d1_{rep}", n, 0, args.driver_memory)),
        ("b_connect_raw_count", bool(remote), lambda: raw_connect(stack, ranges_file, n, raw_remote)),
        ("b2_connect_bare_job", bool(remote),
         lambda: bare_job(stack, f"b2c_{rep}", ranges_file, args.driver_memory, bare_remote)),
        ("c_connect_1_batch", bool(remote),
         lambda: microbatch_run(stack, f"cc1_{rep}", n, n, args.driver_memory, remote)),
        ("c_connect_1_batch_pb", bool(remote),
         lambda: microbatch_run(stack, f"cc1pb_{rep}", n, n, args.driver_memory, remote,
                                contributions="per_batch")),
        ("d_connect_1_batch", bool(remote), lambda: peer_run(stack, f"dc1_{rep}", n, 0, args.driver_memory,
                                                             peer_remote)),
        ("b2_bare_job_split", split,
         lambda: bare_job(stack, f"b2s_{rep}", ranges_file, args.driver_memory, batch_records=per)),
        ("c_microbatch_split", split, lambda: microbatch_run(stack, f"c10_{rep}", n, per, args.driver_memory)),
        ("d_peer_split", split, lambda: peer_run(stack, f"d10_{rep}", n, per, args.driver_memory)),
        ("c_microbatch_split_run", split,
         lambda: microbatch_run(stack, f"cr10_{rep}", n, per, args.driver_memory, batches_per_run=args.split)),
        ("c_microbatch_split_run_pb", split,
         lambda: microbatch_run(stack, f"cr10pb_{rep}", n, per, args.driver_memory, batches_per_run=args.split,
                                contributions="per_batch")),
        ("b2_connect_bare_job_split", split and bool(remote),
         lambda: bare_job(stack, f"b2cs_{rep}", ranges_file, args.driver_memory, bare_remote, batch_records=per)),
        ("c_connect_split", split and bool(remote),
         lambda: microbatch_run(stack, f"cc10_{rep}", n, per, args.driver_memory, remote)),
        ("d_connect_split", split and bool(remote),
         lambda: peer_run(stack, f"dc10_{rep}", n, per, args.driver_memory, peer_remote)),
        ("c_connect_split_fresh", split and bool(remote),
         lambda: microbatch_run(stack, f"cf10_{rep}", n, per, args.driver_memory, remote, fresh_session=True)),
        ("c_connect_split_warm", split and bool(remote),
         lambda: microbatch_run(stack, f"cw10_{rep}", n, per, args.driver_memory, remote, warm_tasks=True)),
        ("c_connect_split_run", split and bool(remote),
         lambda: microbatch_run(stack, f"ccr10_{rep}", n, per, args.driver_memory, remote,
                                batches_per_run=args.split)),
        ("c_connect_split_warm_run", split and bool(remote),
         lambda: microbatch_run(stack, f"cwr10_{rep}", n, per, args.driver_memory, remote, warm_tasks=True,
                                batches_per_run=args.split)),
        ("c_connect_split_warm_run_pb", split and bool(remote),
         lambda: microbatch_run(stack, f"cwr10pb_{rep}", n, per, args.driver_memory, remote, warm_tasks=True,
                                batches_per_run=args.split, contributions="per_batch")),
    ]


# (label, run, the run it is compared with): records/s of the first over the second. The headline of each mode
# comes first: against the peer on equal footing, then against the bare job (what exactly-once costs).
RATIOS = [
    ("c/d", "c_microbatch_1_batch", "d_peer_1_batch"),
    ("c/b2", "c_microbatch_1_batch", "b2_bare_job"),
    ("c/b2o", "c_microbatch_1_batch", "b2o_bare_job_observed"),
    ("c/b", "c_microbatch_1_batch", "b_spark_raw_count"),
    ("c/a", "c_microbatch_1_batch", "a_kafka_consumer"),
    ("c'/d'", "c_connect_1_batch", "d_connect_1_batch"),
    ("c'/b2'", "c_connect_1_batch", "b2_connect_bare_job"),
    ("c'/b'", "c_connect_1_batch", "b_connect_raw_count"),
    ("c'/d", "c_connect_1_batch", "d_peer_1_batch"),
    ("c'/a", "c_connect_1_batch", "a_kafka_consumer"),
    ("c_split/d_split", "c_microbatch_split", "d_peer_split"),
    ("c_run/d_split", "c_microbatch_split_run", "d_peer_split"),
    ("c'_run/d'_split", "c_connect_split_run", "d_connect_split"),
    ("c'w_run/d'_split", "c_connect_split_warm_run", "d_connect_split"),
    ("c_pb/d", "c_microbatch_1_batch_pb", "d_peer_1_batch"),
    ("c'_pb/d'", "c_connect_1_batch_pb", "d_connect_1_batch"),
    ("c_run_pb/d_split", "c_microbatch_split_run_pb", "d_peer_split"),
    ("c'w_run_pb/d'_split", "c_connect_split_warm_run_pb", "d_connect_split"),
    # The ceiling: the peer over the bare job (the same Spark work, no ledger, no streaming engine). An engine that
    # runs this job can be ahead of the peer by at most d's time over b2's, even if exactly-once cost nothing.
    ("d/b2", "d_peer_1_batch", "b2_bare_job"),
    ("d'/b2'", "d_connect_1_batch", "b2_connect_bare_job"),
    ("d_split/b2_split", "d_peer_split", "b2_bare_job_split"),
    ("d'_split/b2'_split", "d_connect_split", "b2_connect_bare_job_split"),
    ("c_run_pb/b2_split", "c_microbatch_split_run_pb", "b2_bare_job_split"),
    ("c'w_run_pb/b2'_split", "c_connect_split_warm_run_pb", "b2_connect_bare_job_split"),
    ("c'_split/d'_split", "c_connect_split", "d_connect_split"),
    ("c'_split/d_split", "c_connect_split", "d_peer_split"),
    ("c'_split/c'f_split", "c_connect_split", "c_connect_split_fresh"),
    ("c'w_split/d'_split", "c_connect_split_warm", "d_connect_split"),
    ("c'w_split/c'_split", "c_connect_split_warm", "c_connect_split"),
]


def timed_reps(runs: dict[str, list[dict]], key: str) -> list[dict]:
    """The reps of `key` that timed each of several batches (none for the peer over Connect, whose foreachBatch
    runs in the server)."""
    return [r for r in runs.get(key, []) if len(r.get("batch_job_s", [])) > 1]


def where_batches_go(runs: dict[str, list[dict]]) -> list[list[object]]:
    """A run of batches next to the peer's and the bare job's: rows (run, batches, Spark jobs, commits, plans, the
    wall outside them, wall), medians of the reps in s. microbatch's Spark jobs exclude its commits; the peer's
    foreachBatch includes its merge, and the bare job does not commit."""
    rows: list[list[object]] = []
    for key in ("c_microbatch_split_run_pb", "c_microbatch_split_run", "d_peer_split", "b2_bare_job_split"):
        timed = timed_reps(runs, key)
        if not timed:
            continue
        own = "commit_s" in timed[0]  # only microbatch's runs time their commits and plans
        commits = median([r.get("commit_s", 0.0) for r in timed])
        plans = median([r.get("plan_s", 0.0) for r in timed])
        outside = median([r["wall_s"] - sum(r["batch_job_s"]) - r.get("commit_s", 0.0) - r.get("plan_s", 0.0)
                          for r in timed])
        rows.append([key, median([len(r["batch_job_s"]) for r in timed]),
                     round(median([sum(r["batch_job_s"]) for r in timed]), 2),
                     round(commits, 2) if own else "-", round(plans, 2) if own else "-", round(outside, 2),
                     median([r["wall_s"] for r in timed])])
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--split", type=int, default=10, help="also run batches of records/split")
    parser.add_argument("--split-reps", type=int, default=None, help="reps of the split runs (default --reps)")
    parser.add_argument("--driver-memory", default="1g", help="spark-submit --driver-memory (Spark's default: 1g)")
    parser.add_argument("--runs", type=lambda v: set(v.split(",")), default=set(),
                        help="only these runs, comma-separated (e.g. c_microbatch_1_batch,d_peer_1_batch); default all")
    parser.add_argument("--connect", action="store_true",
                        help="also measure b' and c' on one warm Spark Connect server (spark.mode: connect)")
    args = parser.parse_args(argv)
    split_reps = args.split_reps or args.reps
    n = args.records
    results: dict = {"machine": machine(), "args": vars(args), "runs": {}}
    runs = results["runs"]
    with local_stack() as stack, contextlib.ExitStack() as servers:
        results["produce"], ends, ranges_file = filled_topic(stack, TOPIC, n, args.partitions)
        results["partition_sizes"] = ends
        remote = None
        if args.connect:
            from microbatch.dev.spark import SparkConnectServer

            server = servers.enter_context(SparkConnectServer(
                stack.work_dir / "connect", driver_memory=args.driver_memory,
                conf={"spark.sql.shuffle.partitions": "4"}))
            remote = server.remote
            results["connect_warmup"] = raw_connect(stack, ranges_file, n, remote)
        print(f"produced {n:,} records in {results['produce']['seconds']}s; measuring...", flush=True)
        for rep in range(args.reps):
            split = args.split > 1 and rep < split_reps
            plan = rep_plan(stack, args, rep, split, ranges_file, remote)
            for key, due, measure in plan:
                if due and (not args.runs or key in args.runs):
                    runs.setdefault(key, []).append(measure())
            write_results("throughput_partial", results)  # a long run that dies later keeps its finished reps
            print(f"rep {rep + 1}/{args.reps} done", flush=True)

    summary: dict[str, dict] = {}
    for key, values in runs.items():
        wall = median([v["wall_s"] for v in values])
        if key == "a_kafka_consumer":
            engine_rate = median([v["engine_rate"] for v in values])
        else:
            engine_rate = n / median([v["engine_s"] for v in values])
        summary[key] = {"wall_s": wall, "wall_rate": n / wall, "engine_rate": engine_rate, "reps": len(values)}
    results["summary"] = summary
    ratios = {}
    for label, mine, other in RATIOS:
        if mine in summary and other in summary:
            ratios[label] = {"wall": round(summary[mine]["wall_rate"] / summary[other]["wall_rate"], 3),
                             "engine": round(summary[mine]["engine_rate"] / summary[other]["engine_rate"], 3)}
            if len(runs[mine]) == len(runs[other]):  # the same reps: the median of each rep's own ratio
                ratios[label]["wall_paired"] = round(median(
                    [o["wall_s"] / m["wall_s"] for m, o in zip(runs[mine], runs[other], strict=True)]), 3)
    results["ratios"] = ratios
    c_runs = runs.get("c_microbatch_1_batch", [])
    phase_keys = ("plan_s", "stage_wall_s", "stage_engine_s", "read_s", "stage_write_s", "commit_s")
    results["phases_c_1_batch_median"] = {k: median([r[k] for r in c_runs]) for k in phase_keys} if c_runs else {}
    # Per batch, each run of microbatch: the Spark job (the stage's one pass) and what each batch pays around it.
    per_batch = []
    for key in ("c_microbatch_1_batch", "c_connect_1_batch", "c_microbatch_split", "c_connect_split",
                "c_connect_split_fresh", "c_connect_split_warm", "c_microbatch_split_run", "c_connect_split_run",
                "c_connect_split_warm_run", "c_microbatch_1_batch_pb", "c_connect_1_batch_pb",
                "c_microbatch_split_run_pb", "c_connect_split_warm_run_pb"):
        if key in runs:
            b = median([r["batches"] for r in runs[key]])
            job = median([r["stage_engine_s"] for r in runs[key]]) / b
            plan_s = median([r["plan_s"] for r in runs[key]]) / b
            around = median([r["stage_wall_s"] - r["stage_engine_s"] for r in runs[key]]) / b
            commit_s = median([r["commit_s"] for r in runs[key]]) / b
            per_batch.append([key, b, round(job, 3), round(plan_s, 3), round(around, 3), round(commit_s, 3),
                              round(plan_s + around + commit_s, 3)])
    results["per_batch"] = per_batch
    # The Spark job of each batch in one application: the first pays the JVM's warm-up (JIT, class loading, the
    # first Kafka and JDBC connections), the rest run warm. The peer's is its foreachBatch (job, JDBC write, merge).
    first_and_rest = []
    for key in ("b2_bare_job_split", "d_peer_split", "c_microbatch_split_run", "c_microbatch_split_run_pb",
                "b2_connect_bare_job_split", "c_connect_split_warm_run_pb"):
        timed = timed_reps(runs, key)
        if timed:
            lists = [r["batch_job_s"] for r in timed]
            first_and_rest.append([key, median([len(x) for x in lists]), median([x[0] for x in lists]),
                                   median([median(x[1:]) for x in lists]), median([sum(x) for x in lists]),
                                   median([r["wall_s"] - sum(r["batch_job_s"]) for r in timed])])
    results["first_batch_and_the_rest"] = first_and_rest
    results["where_batches_go"] = where_batches_go(runs)
    if "c_connect_1_batch" in runs:
        results["phases_c_connect_median"] = {k: median([r[k] for r in runs["c_connect_1_batch"]])
                                              for k in phase_keys}
    peak: dict[str, float] = {}
    for r in c_runs + runs.get("c_microbatch_split", []) + runs.get("c_connect_1_batch", []):
        for k, v in r["peak_rss_mb"].items():
            peak[k] = max(peak.get(k, 0), v)
    results["peak_rss_mb_microbatch"] = peak
    results["command"] = reproduce_command("throughput.py", argv)
    path = write_results("throughput", results)

    rows = [[key, s["reps"], s["wall_s"], s["wall_rate"], s["engine_rate"]] for key, s in summary.items()]
    print_table(f"Throughput, {n:,} records over {args.partitions} partitions (medians)",
                ["run", "reps", "wall s", "wall rec/s", "engine rec/s"], rows)
    print_table("Ratios (records/s of c over the other)", ["ratio", "wall", "engine", "wall, median of each rep's"],
                [[k, v["wall"], v["engine"], v.get("wall_paired", "-")] for k, v in ratios.items()])
    print_table("microbatch, one batch: phases (medians, s)", ["phase", "spark-submit", "Spark Connect"],
                [[k, v, results.get("phases_c_connect_median", {}).get(k, "-")]
                 for k, v in results["phases_c_1_batch_median"].items()])
    print_table("microbatch per batch (medians, s): the Spark job, and the fixed cost around it", [
        "run", "batches", "Spark job", "plan", "stage outside the job (JVM or client start, session)", "commit",
        "fixed cost"], per_batch)
    print_table("Each batch's Spark job in a run of batches (medians, s; the peer's: its foreachBatch, merge included)",
                ["run", "batches", "first batch", "each later batch", "all batches", "wall outside them"],
                first_and_rest)
    print_table("A run of batches against the peer's (medians, s): the Spark jobs (the peer's with its merges), "
                "and what each pays outside them", ["run", "batches", "Spark jobs", "commits", "plans",
                                                    "driver outside them (JVM and Spark start, imports, ledger)",
                                                    "wall"], results["where_batches_go"])
    print_table("Peak RSS, MB (max over runs)", ["process", "MB"], [[k, v] for k, v in sorted(peak.items())])
    by_size = [[f"{key} ({n // runs[key][0]['batches']:,} records per batch)",
                median([r["peak_rss_mb"].get("stage_jvm", 0) for r in runs[key]]),
                median([r["peak_rss_mb"].get("stage_jvm_heap_after_gc", 0) for r in runs[key]])]
               for key in ("c_microbatch_1_batch", "c_microbatch_split") if key in runs]
    results["stage_driver_by_batch_size"] = by_size
    print_table("Stage driver JVM by batch size (spark-submit, medians)", ["run", "peak RSS MB", "heap after GC MB"],
                by_size)
    spark_rows = []
    for key in ("b_spark_raw_count", "b2_bare_job", "b2o_bare_job_observed", "c_microbatch_1_batch", "d_peer_1_batch",
                "c_microbatch_split", "c_microbatch_split_run", "c_microbatch_split_run_pb", "b2_bare_job_split",
                "d_peer_split"):
        metrics = [r["spark_metrics"] for r in runs.get(key, []) if r.get("spark_metrics")]
        if metrics:
            m = {k: median([x[k] for x in metrics]) for k in metrics[0]}
            spark_rows.append([key, m["stages"], m["tasks"], m["run_s"], m["cpu_s"], m["gc_s"], m["deserialize_s"],
                               m["cpu_s"] * 1e6 / n, m["read_cpu_s"] * 1e6 / n,
                               m["cpu_s"] - m["read_cpu_s"], m["shuffle_write_mb"]])
    results["spark_task_metrics"] = spark_rows
    print_table("Spark task metrics from the event logs (what the Spark UI's stage pages show; medians, summed "
                "over tasks)", ["run", "stages", "tasks", "executor run s", "executor CPU s", "GC s",
                                "deserialize s", "CPU µs/record", "of it in the tasks that read Kafka",
                                "CPU s after a shuffle", "shuffle write MB"], spark_rows)
    py_rows = []
    for kind in ("plan", "stage", "commit") if c_runs else ():
        cpu = median([r["python_cpu_s"][kind] for r in c_runs])
        imports = median([r["python_import_s"][kind] for r in c_runs])
        wall = median([r["stage_wall_s" if kind == "stage" else f"{kind}_s"] for r in c_runs])
        top = c_runs[0]["python_top"][kind]
        py_rows.append([kind, wall, cpu, imports, "; ".join(f"{name} {share:.0%}" for name, share in top[:3])])
    results["python_profile_c_1_batch"] = py_rows
    print_table("Python in microbatch, one batch (py-spy on each phase's Python process, idle samples excluded; "
                "medians)", ["phase", "timed s", "Python CPU s", "of it imports s",
                             "top functions outside imports (rep 1, share of all samples)"], py_rows)
    path = write_results("throughput", results)
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
