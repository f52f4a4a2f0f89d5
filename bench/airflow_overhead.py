"""Airflow's own overhead around the work, in a `@continuous` DAG run by the real scheduler.

It starts a private Kafka + PostgreSQL, produces --records access-log lines over 4 partitions, writes
an ip_count spec with `schedule: "@continuous"` and --batch records per batch, starts
`airflow standalone` (scheduler, dag-processor, LocalExecutor, api-server) on free ports, unpauses the
DAG, and lets it run until every record is committed plus --idle-runs runs that find nothing new.
Then it reads the task instances from Airflow's REST API and the work times from the ledger, and
reports (medians):

- the gaps Airflow adds: DAG run start -> first task start, between consecutive tasks, last task
  end -> run end, and run end -> next run start (what `@continuous` costs between runs);
- each task's duration against the work inside it (the ledger's plan_s, read_s + stage_write_s,
  commit_s): the difference is the task process start (and for the stage, spark-submit's JVM +
  Spark start).

With --connect the stage tasks are clients of one warm Spark Connect server (`spark.mode: connect`, as on the
local stack of `make airflow`), and the last table sums what each batch pays beyond its Spark job: plan,
commit, the stage task outside its job (process and client start, session) and Airflow's gaps, twice: from the
plan task's start to the commit task's end (the tasks and the gaps between them, the issue's sum), and over the
whole DAG run (also Airflow's start of the run before its first task and its end after the last).
--idle-sleep sets the scheduler's `scheduler_idle_sleep_time` (the local stack's default is dev/airflow.py's); a
comma-separated list measures each value in turn, on a stack of its own, with the scheduler's CPU (its own process,
not its workers and tasks) over the whole run: the price of a shorter nap.
--start-methods fork,forkserver measures each of the scheduler's `mp_start_method` in turn, on a stack of its own:
forkserver (the local stack's) forks the workers from a process that imported `microbatch.airflow.preload`, fork
(Airflow's default) leaves every task to import its modules itself.

    PYTHONPATH=include:. .venv/bin/python bench/airflow_overhead.py --records 5000 --batch 1000 --connect \
        --start-methods fork,forkserver
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import yaml
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_stack, machine, median, print_table, reproduce_command, write_results, write_spec

TOPIC = "bench_overhead"
DAG_ID = "ip_count"
TASKS = ("plan", "stage", "commit")


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def _tail(work: Path) -> str:
    """The end of standalone's log and of the task logs: the stack's directory is removed on exit."""
    logs = [work / "airflow.log", *sorted((work / "airflow" / "logs").rglob("*.log"))[-3:]]
    return "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in logs if p.exists())


def run_gaps(runs: list[dict], tis: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Seconds Airflow spends around the tasks of each finished run, from the REST API's timestamps."""
    gaps: dict[str, list[float]] = {}

    def add(name: str, value: float | None) -> None:
        if value is not None:
            gaps.setdefault(name, []).append(round(value, 3))

    ordered = sorted((r for r in runs if r.get("start_date") and r.get("end_date")), key=lambda r: r["start_date"])
    for prev, run in zip([None, *ordered], ordered, strict=False):
        if prev is not None:
            add("run end -> next run start", _ts(run["start_date"]) - _ts(prev["end_date"]))
        # Tasks that ran: skipped ones (stage and commit of a run with nothing new) carry timestamps too.
        started = [t for t in tis.get(run["dag_run_id"], [])
                   if t.get("state") == "success" and t.get("start_date") and t.get("end_date")]
        started.sort(key=lambda t: t["start_date"])
        if not started:
            continue
        kind = "work run" if any(t["task_id"] == "stage" for t in started) else "idle run"
        add(f"run start -> first task start ({kind})", _ts(started[0]["start_date"]) - _ts(run["start_date"]))
        for a, b in itertools.pairwise(started):
            add(f"{a['task_id']} end -> {b['task_id']} start", _ts(b["start_date"]) - _ts(a["end_date"]))
        add(f"last task end -> run end ({kind})", _ts(run["end_date"]) - _ts(started[-1]["end_date"]))
        add(f"whole run ({kind})", _ts(run["end_date"]) - _ts(run["start_date"]))
    return gaps


def airflow_memory(root: int) -> dict[str, float]:
    """Proportional set size (shared pages split among their sharers) of Airflow's processes, in MB: the whole
    tree, and the scheduler's subtree (its executor's workers, and the forkserver they fork from, if any)."""
    import psutil

    def pss(procs: list[psutil.Process]) -> float:
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_full_info().pss / 2**20
        return round(total, 1)

    top = psutil.Process(root)
    everyone = [top, *top.children(recursive=True)]
    schedulers = [p for p in top.children() if "scheduler" in p.cmdline()]
    return {"airflow_tree_pss": pss(everyone),
            "scheduler_and_workers_pss": pss([d for p in schedulers for d in [p, *p.children(recursive=True)]])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=1_000, help="max records per batch")
    parser.add_argument("--idle-runs", type=int, default=5, help="runs that find nothing new, after the last commit")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--connect", action="store_true", help="stage on a warm Spark Connect server")
    parser.add_argument("--idle-sleep", default=None,
                        help="[scheduler] scheduler_idle_sleep_time, s, or several comma-separated (default: the local "
                        "stack's)")
    parser.add_argument("--start-methods", default="forkserver",
                        help="comma-separated [scheduler] mp_start_method values, each measured in turn on its own "
                        "stack: forkserver (the local stack's, with microbatch.airflow.preload) and/or fork "
                        "(Airflow's default on Linux: every task imports its modules itself)")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.start_methods.split(",") if m.strip()]
    sleeps: list[float | None] = [float(v) for v in args.idle_sleep.split(",")] if args.idle_sleep else [None]
    results: dict = {"machine": machine(), "args": vars(args), "by_scheduler": {}}
    variants = [(m, s) for m in methods for s in sleeps]
    for method, sleep in variants:
        name = method if len(sleeps) == 1 else f"{method}, idle sleep {sleep} s"
        nap = "the local stack's" if sleep is None else f"{sleep} s"
        print(f"--- scheduler start method: {method}, idle sleep: {nap}", flush=True)
        results["by_scheduler"][name] = measure(args, method, sleep)
    if len(variants) > 1:
        runs = results["by_scheduler"]
        first = next(iter(runs.values()))["fixed_cost_per_batch_s"]["median_in_run"]
        print_table("A batch beyond its Spark job, by the scheduler's settings (medians, s; PSS at the end)",
                    ["scheduler", "plan start -> commit end", "in the DAG run", "ratio to the first", "scheduler CPU %",
                     "scheduler + workers MB", "Airflow MB"],
                    [[m, (cost := r["fixed_cost_per_batch_s"])["plan_start_to_commit_end"], cost["median_in_run"],
                      cost["median_in_run"] / first, r["scheduler_cpu_percent"],
                      r["memory_mb"]["scheduler_and_workers_pss"], r["memory_mb"]["airflow_tree_pss"]]
                     for m, r in runs.items()])
    results["command"] = reproduce_command("airflow_overhead.py", argv)
    path = write_results("airflow_overhead", results)
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


def scheduler_cpu(root: int) -> float:
    """CPU seconds (user + system) of the scheduler's own process so far, not of its workers and tasks."""
    import psutil

    top = psutil.Process(root)
    times = [p.cpu_times() for p in top.children() if "scheduler" in p.cmdline()]
    return sum(t.user + t.system for t in times)


def measure(args: argparse.Namespace, method: str, idle_sleep: float | None = None) -> dict:
    """One stack, one Airflow with the scheduler's `mp_start_method` = `method`, one @continuous DAG until caught up."""
    from microbatch.dev import localenv
    from microbatch.dev.airflow import AirflowStandalone
    from microbatch.dev.datagen import generate_lines, produce_lines
    from microbatch.dev.kafka import create_topic
    from microbatch.ledger.database import transaction

    with local_stack("mb-overhead-") as stack, contextlib.ExitStack() as servers:
        create_topic(stack.bootstrap, TOPIC, 4)
        produce_lines(stack.bootstrap, TOPIC, generate_lines(args.records, malformed=0.0, seed=3))
        url = stack.fresh_ledger("overhead")
        spec_dir = write_spec(stack.work_dir / "pipelines", [TOPIC], args.batch)
        spec_path = spec_dir / "ip_count.yaml"
        spec = yaml.safe_load(spec_path.read_text())
        spec["schedule"] = "@continuous"
        spec["retries"] = {"count": 0, "delay_seconds": 1}
        env = {**localenv.local_env(), "MICROBATCH_LEDGER_URL": url, "MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap,
               "MICROBATCH_PIPELINES_DIR": str(spec_dir)}
        if args.connect:
            from microbatch.dev.spark import SparkConnectServer

            server = servers.enter_context(SparkConnectServer(stack.work_dir / "connect"))
            env["MICROBATCH_SPARK_REMOTE"] = server.remote
            spec["spark"] = {"mode": "connect", "conf": {k: v for k, v in spec["spark"]["conf"].items()
                                                         if k.startswith("spark.sql.")}}
        if idle_sleep is not None:
            env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] = str(idle_sleep)
        env["AIRFLOW__SCHEDULER__MP_START_METHOD"] = method
        spec_path.write_text(yaml.safe_dump(spec))
        home = stack.work_dir / "airflow"
        home.mkdir()
        server = AirflowStandalone({**os.environ, **env}, home, stack.work_dir / "airflow.log")
        try:
            server.wait_ready(timeout=300)
            deadline = time.monotonic() + 300
            while server.api("GET", f"/api/v2/dags/{DAG_ID}")[0] != 200:  # the dag-processor has parsed it
                if time.monotonic() > deadline:
                    raise RuntimeError("the DAG never appeared:\n" + _tail(stack.work_dir))
                time.sleep(1)
            status, body = server.api("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
            if status != 200:
                raise RuntimeError(f"could not unpause {DAG_ID}: {status} {body}")
            unpaused, cpu_before = time.monotonic(), scheduler_cpu(server.proc.pid)
            print(f"{DAG_ID} unpaused; waiting for {args.records:,} records and {args.idle_runs} idle runs", flush=True)
            runs: list[dict] = []
            caught_up_at = None  # finished runs when the last record was committed
            while True:
                with transaction(url) as session:
                    committed = session.execute(text(
                        "SELECT coalesce(sum((counts->>'records')::bigint), 0) FROM batches "
                        "WHERE state = 'committed'")).scalar_one()
                runs = server.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100&order_by=start_date")[1]
                runs = runs.get("dag_runs", [])
                failed = [r for r in runs if r["state"] == "failed"]
                if failed:
                    raise RuntimeError(f"run {failed[0]['dag_run_id']} failed:\n" + _tail(stack.work_dir))
                finished = sum(1 for r in runs if r["state"] == "success")
                if committed >= args.records and caught_up_at is None:
                    caught_up_at = finished
                if caught_up_at is not None and finished > caught_up_at + args.idle_runs:
                    break
                if time.monotonic() - unpaused > args.timeout:
                    raise RuntimeError(f"only {committed} of {args.records} records committed in {args.timeout:.0f}s")
                time.sleep(2)
            tis = {}
            for run in runs:
                path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances"
                tis[run["dag_run_id"]] = server.api("GET", path)[1].get("task_instances", [])
            memory = airflow_memory(server.proc.pid)
            cpu_percent = round(100 * (scheduler_cpu(server.proc.pid) - cpu_before) / (time.monotonic() - unpaused), 1)
        finally:
            server.stop()
        with transaction(url) as session:
            batches = session.execute(text("SELECT airflow_run_id, timings FROM batches WHERE state = 'committed'")
                                      ).all()

    results: dict = {"memory_mb": memory, "scheduler_cpu_percent": cpu_percent}
    gaps = run_gaps([r for r in runs if r["state"] == "success"], tis)
    work = {run_id: timings for run_id, timings in batches}
    inside: dict[str, list[float]] = {}
    for run_id, timings in work.items():
        for ti in tis.get(run_id, []):
            if ti["task_id"] not in TASKS or ti.get("duration") is None:
                continue
            inner = {"plan": timings.get("plan_s"), "commit": timings.get("commit_s"),
                     "stage": (timings.get("read_s") or 0) + (timings.get("stage_write_s") or 0)}[ti["task_id"]]
            inside.setdefault(f"{ti['task_id']}: task duration", []).append(ti["duration"])
            inside.setdefault(f"{ti['task_id']}: work inside (ledger)", []).append(inner or 0.0)
            inside.setdefault(f"{ti['task_id']}: overhead (duration - work)", []).append(ti["duration"] - (inner or 0))
    results["gaps_s"] = gaps
    results["tasks_s"] = inside
    # Per work run: what the batch pays beyond its Spark job (plan, commit, the stage task outside its job, and
    # Airflow's gaps), i.e. the whole run, plus the gap to the next run, minus the job.
    fixed, tasks_span = [], []
    for run in runs:
        timings = work.get(run["dag_run_id"])
        if run["state"] != "success" or not timings or not run.get("start_date") or not run.get("end_date"):
            continue
        job = (timings.get("read_s") or 0) + (timings.get("stage_write_s") or 0)
        fixed.append(_ts(run["end_date"]) - _ts(run["start_date"]) - job)
        # The issue's sum: plan, the stage outside its job, commit and the gaps between them, without Airflow's
        # start and end of the run around the tasks: the plan task's start to the commit task's end.
        by_task = {t["task_id"]: t for t in tis.get(run["dag_run_id"], []) if t.get("start_date") and t.get("end_date")}
        if "plan" in by_task and "commit" in by_task:
            tasks_span.append(_ts(by_task["commit"]["end_date"]) - _ts(by_task["plan"]["start_date"]) - job)
    between = median(gaps.get("run end -> next run start", [0.0]))
    results["fixed_cost_per_batch_s"] = {"runs": len(fixed), "median_in_run": median(fixed) if fixed else None,
                                         "with_gap_to_next_run": (median(fixed) + between) if fixed else None,
                                         "plan_start_to_commit_end": median(tasks_span) if tasks_span else None}
    results["runs"] = len(runs)
    results["batches"] = len(batches)
    print_table(f"Airflow around the tasks of a @continuous DAG ({len(runs)} runs, {len(batches)} batches; medians, s)",
                ["gap", "n", "median s", "max s"],
                [[k, len(v), median(v), max(v)] for k, v in sorted(gaps.items())])
    print_table("Task duration against the work inside it (work runs; medians, s)", ["task", "n", "median s"],
                [[k, len(v), median(v)] for k, v in inside.items()])
    cost = results["fixed_cost_per_batch_s"]
    print_table("What a batch pays beyond its Spark job (work runs; medians, s)", ["", "s"], [
        ["from the plan task's start to the commit task's end (the tasks and the gaps between them)",
         cost["plan_start_to_commit_end"]],
        ["in the DAG run (plan, commit, stage outside its job, gaps)", cost["median_in_run"]],
        ["with the gap to the next run (@continuous)", cost["with_gap_to_next_run"]],
        ["the scheduler's own CPU over the run, % of one core", cpu_percent]])
    return results


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
