"""Latency of a small batch (--records, 1,000 by default) from plan to commit.

spark-submit mode (the default deployment): plan and commit each in their own Python process (as
Airflow tasks run), stage = spark-submit spark_jobs/run_batch.py. The JVM + Spark start share is
measured with a tiny spark-submit app (launch -> SparkSession ready -> first job -> stopped).
Spark Connect mode (--connect): a long-lived Spark Connect server started once (the
pyspark wheel's SparkConnectServer class, as start-connect-server.sh runs it) with the same jars; the
stage runs staging.stage_batch through a Connect client (bench/connect_stage.py), so no JVM starts per batch.
"plan->commit" = plan + stage process + commit (each phase's own time; Python task-process start is
shown apart). With --connect, the same batch also runs with plan, stage and commit each in a process forked
from a forkserver that preloaded `microbatch.airflow.preload`, as the local stack's Airflow starts its tasks
("tasks forked warm"). Airflow's own scheduling gap between tasks: bench/airflow_overhead.py.

    PYTHONPATH=include:. .venv/bin/python bench/latency.py --connect
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    PYTHON,
    ROOT,
    local_stack,
    machine,
    median,
    phase,
    print_table,
    reproduce_command,
    run_sampled,
    spark_env,
    spark_submit,
    warm_task,
    write_results,
    write_spec,
)

TOPIC = "bench_latency"


def produce_batch(bootstrap: str, records: int, index: int) -> None:
    from microbatch.dev.datagen import generate_lines, produce_lines

    start = datetime(2026, 11, 22, 12, 0, tzinfo=UTC) + timedelta(minutes=2 * index)
    produce_lines(bootstrap, TOPIC, generate_lines(records, malformed=0, out_of_order=0, start=start, seed=index))


def warm_batch(env: dict[str, str], connect_env: dict[str, str]) -> dict:
    """plan, the Connect stage and commit, each in a process forked from a forkserver that preloaded
    `microbatch.airflow.preload` (as the local stack's Airflow starts its tasks)."""
    plan, plan_wall = warm_task("phase", ["plan", "ip_count"], env)
    batch_id = str(plan["batch_id"])
    extra, stage_s = warm_task("connect_stage", ["ip_count", batch_id], {**env, **connect_env})
    commit, commit_wall = warm_task("phase", ["commit", "ip_count", batch_id], env)
    return {"records": plan["records"], "plan_s": plan["seconds"], "stage_s": round(stage_s, 3),
            "commit_s": commit["transaction_s"],
            "plan_to_commit_s": round(plan["seconds"] + stage_s + commit["transaction_s"], 3),
            "task_process_overhead_s": round(plan_wall - plan["seconds"] + commit_wall - commit["transaction_s"], 3),
            "connect": extra}


def one_batch(env: dict[str, str], spec, mode: str, connect_env: dict[str, str] | None = None) -> dict:
    if mode == "connect-warm":
        return warm_batch(env, connect_env or {})
    plan, plan_proc = phase("plan", env, "ip_count")
    batch_id = str(plan["batch_id"])
    if mode == "spark-submit":
        stage = spark_submit(APPS / "stage_entry.py", ["--pipeline", "ip_count", "--batch-id", batch_id],
                             env, conf=dict(spec.spark.conf))
        stage_s, extra = stage.seconds, {}
    else:
        stage = run_sampled([PYTHON, str(ROOT / "bench" / "connect_stage.py"), "ip_count", batch_id],
                            env={**spark_env(), **env, **(connect_env or {})})
        if stage.returncode != 0:
            raise RuntimeError(f"connect stage failed:\n{stage.stderr[-3000:]}")
        stage_s, extra = stage.seconds, stage.json_lines()[-1]
    commit, commit_proc = phase("commit", env, "ip_count", batch_id)
    return {"records": plan["records"], "plan_s": plan["seconds"], "stage_s": round(stage_s, 3),
            "commit_s": commit["transaction_s"],
            "plan_to_commit_s": round(plan["seconds"] + stage_s + commit["transaction_s"], 3),
            "task_process_overhead_s": round(plan_proc.seconds - plan["seconds"]
                                             + commit_proc.seconds - commit["transaction_s"], 3),
            "stage_peak_rss_mb": stage.peak_rss_mb, **({"connect": extra} if extra else {})}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--connect", action="store_true", help="also measure the Spark Connect mode")
    args = parser.parse_args(argv)
    from microbatch.config import find_spec
    from microbatch.dev.kafka import create_topic
    from microbatch.dev.spark import SparkConnectServer

    results: dict = {"machine": machine(), "args": vars(args)}
    index = 0
    with local_stack() as stack:
        create_topic(stack.bootstrap, TOPIC, 8)
        spec_dir = write_spec(stack.work_dir / "spec", [TOPIC], args.records)
        spec = find_spec("ip_count", spec_dir)
        url = stack.fresh_ledger("latency")
        env = {"MICROBATCH_LEDGER_URL": url, "MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap,
               "MICROBATCH_PIPELINES_DIR": str(spec_dir)}
        startup = []
        for _ in range(args.reps):
            t0 = time.time()
            info = spark_submit(APPS / "startup.py", [], {}).json_lines()[-1]
            startup.append({"to_python_s": info["python_start"] - t0, "to_session_s": info["session_ready"] - t0,
                            "first_job_s": info["first_job_done"] - info["session_ready"],
                            "stop_s": info["stopped"] - info["first_job_done"], "total_s": time.time() - t0})
        results["spark_submit_startup"] = startup
        runs = []
        for _ in range(args.reps):
            produce_batch(stack.bootstrap, args.records, index)
            index += 1
            runs.append(one_batch(env, spec, "spark-submit"))
        results["spark_submit_mode"] = runs
        if args.connect:
            server = SparkConnectServer(stack.work_dir / "connect").start()
            connect_env = {"SPARK_REMOTE": server.remote}
            try:
                produce_batch(stack.bootstrap, args.records, index)
                index += 1
                results["connect_warmup"] = one_batch(env, spec, "connect", connect_env)
                cruns, wruns = [], []
                for _ in range(args.reps):  # alternated, so that both meet the server equally warm
                    for mode, runs_of_mode in (("connect", cruns), ("connect-warm", wruns)):
                        produce_batch(stack.bootstrap, args.records, index)
                        index += 1
                        runs_of_mode.append(one_batch(env, spec, mode, connect_env))
                results["connect_mode"] = cruns
                results["connect_warm_mode"] = wruns
            finally:
                server.stop()

    s_to_session = median([s["to_session_s"] for s in startup])
    s_total = median([s["total_s"] for s in startup])
    rows = [["spark-submit startup app: launch -> SparkSession ready", s_to_session],
            ["spark-submit startup app: launch -> exit (1 tiny job)", s_total]]
    for label, key in (("spark-submit mode", "spark_submit_mode"), ("Spark Connect mode", "connect_mode"),
                       ("Spark Connect, tasks forked warm", "connect_warm_mode")):
        if key not in results:
            continue
        rs = results[key]
        for field in ("plan_s", "stage_s", "commit_s", "plan_to_commit_s", "task_process_overhead_s"):
            rows.append([f"{label}: {field}", median([r[field] for r in rs])])
    p2c = median([r["plan_to_commit_s"] for r in runs])
    results["jvm_spark_start_share"] = round(s_total / p2c, 3)
    rows.append(["spark-submit mode: JVM+Spark start/stop share of plan->commit", results["jvm_spark_start_share"]])
    results["command"] = reproduce_command("latency.py", argv)
    path = write_results("latency", results)
    print_table(f"Latency of a {args.records:,}-record batch (medians of {args.reps}, seconds)", ["measure", "value"],
                rows)
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
