"""The local stack in `microbatch`: the whole path on it (`demo`: services, data, the ip_count and clicks DAGs,
the results) and Airflow on it (`airflow`: `airflow standalone` with this project's dags/ and plugins/)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer

from microbatch import settings
from microbatch.cli.common import _bootstrap, _quiet_clients, _run_log_path, console
from microbatch.cli.dag_runs import _dag_runs, _log_for
from microbatch.cli.ledger_views import history, show, status
from microbatch.cli.pipelines import generate
from microbatch.dev import localenv
from microbatch.errors import MicrobatchError


def _create_output_topics(pipeline: str) -> None:
    """The output topics of a shipped pipeline, as `microbatch migrate` creates them."""
    from microbatch.config import find_spec
    from microbatch.kafka.topics import migrate_output_topics

    migrate_output_topics(find_spec(pipeline), settings.kafka_settings)


def _generate_clicks(count: int, seed: int) -> None:
    """JSON clicks into `clicks_source` (created if missing), with malformed, late and forget clicks."""
    from microbatch.dev.datagen import generate_clicks, produce_lines
    from microbatch.dev.kafka import create_topic

    bootstrap = _bootstrap()
    create_topic(bootstrap, "clicks_source", 4)
    clicks = generate_clicks(count, seed=seed)
    sent = len(produce_lines(bootstrap, "clicks_source", clicks))
    bad = sum(1 for click in clicks if click.malformed)
    console.print(f"produced {sent} clicks to clicks_source ({bad} malformed)")


def _run_demo_dag(pipeline: str, log_file: Path) -> None:
    """Run a shipped pipeline's DAG until it has caught up, Airflow's log into `log_file`; print each run."""
    from microbatch.airflow.runner import run_until_caught_up

    path = _log_for(pipeline, log_file, f"running the {pipeline} DAG until it has caught up")
    ran = time.monotonic()
    with _dag_runs(path) as report:
        outcomes = run_until_caught_up(pipeline, 20, on_outcome=report)
    _quiet_clients()
    console.print(f"DAG runs took {time.monotonic() - ran:.1f}s")
    if not outcomes or outcomes[-1].state != "success":
        raise typer.Exit(1)


def _start_connect_server() -> None:
    """Start (or reuse) the stack's Spark Connect server and point MICROBATCH_SPARK_REMOTE at it, so the shipped
    pipelines (`spark.mode: auto`) stage as its clients: on one machine that is the fast path (docs/performance.md:
    no JVM start per batch). `make down` stops it with the rest of the stack."""
    from microbatch.dev import stack as devstack

    try:
        os.environ[settings.SPARK_REMOTE_ENV] = devstack.connect()
    except RuntimeError as exc:
        raise MicrobatchError(f"The Spark Connect server did not start: {exc}",
                              fix="Fix the cause in its log, then run `make down` and try again.") from None


def demo(count: int = 10_000) -> None:
    """The whole path on the local stack: services, data, the ip_count and clicks DAGs, the results."""
    from microbatch.dev import stack as devstack
    from microbatch.sinks.schema import migrate as run_migrate

    started = time.monotonic()
    localenv.apply()
    try:
        env = devstack.up()
    except RuntimeError as exc:  # a service that would not start says why and where its log is
        raise MicrobatchError(f"The local stack did not start: {exc}",
                              fix="Fix the cause in that log, then run `make down` and `make demo` again.") from None
    os.environ.update(env)
    _start_connect_server()
    run_migrate(env["MICROBATCH_LEDGER_URL"])
    _create_output_topics("ip_count")
    console.print(f"services ready in {time.monotonic() - started:.1f}s")
    generate(count=count, topic="ip_count_source", partitions=4, ips=20, span_seconds=60, out_of_order=0.1,
             malformed=0.02, seed=int.from_bytes(os.urandom(2), "big"))
    log_file = _run_log_path("demo")
    _run_demo_dag("ip_count", log_file)
    show("ip_count", "ip_counts", limit=15)
    status("ip_count")
    history("ip_count", limit=10)

    _create_output_topics("clicks")
    _generate_clicks(2_000, seed=int.from_bytes(os.urandom(2), "big"))
    _run_demo_dag("clicks", log_file)
    for sink in ("clicks_raw", "page_views", "user_last_page"):
        show("clicks", sink, limit=5)
    show("clicks", "clicks_lake", limit=5, count_by="page")  # a query of the Delta table, without Spark
    console.print(f"demo done in {time.monotonic() - started:.0f}s. The services keep running: try "
                  "`.venv/bin/microbatch status`, then stop them with `make down`.")


def airflow() -> None:
    """Start the local services and `airflow standalone` with this project's dags/ and plugins/."""
    from microbatch.dev import stack as devstack
    from microbatch.dev.kafka import create_topic
    from microbatch.sinks.schema import migrate as run_migrate

    localenv.apply()
    env = devstack.up()
    os.environ.update(env)
    _start_connect_server()
    run_migrate(env["MICROBATCH_LEDGER_URL"])
    create_topic(env["MICROBATCH_KAFKA_BOOTSTRAP"], "ip_count_source", 4)
    _create_output_topics("ip_count")
    port = os.environ.get("AIRFLOW__API__PORT", "8080")
    console.print(f"Airflow UI on http://127.0.0.1:{port} (AIRFLOW_HOME={os.environ['AIRFLOW_HOME']})")
    devstack.record_airflow()  # exec keeps this pid: `make down` stops the standalone and all it starts
    # Airflow's own components as `airflow standalone` runs them, but every socket on 127.0.0.1 (standalone binds
    # its log servers to every interface): microbatch.dev.airflow, see docs/running-for-real.md.
    os.execv(sys.executable, [sys.executable, "-m", "microbatch.dev.airflow"])
