"""Run a pipeline's DAG locally with `dag.test()`: real tasks, real spark-submit, no scheduler. A spec without its
DAG file in dags/ runs too: the DAG built from the spec is written to Airflow's metadata DB first.

Used by `microbatch run`, `make demo` and the end-to-end tests.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from microbatch.dev import localenv
from microbatch.errors import SpecError

log = logging.getLogger(__name__)
MIGRATED_MARKER = ".microbatch-db-migrated"
"""In AIRFLOW_HOME: its metadata DB is migrated (by `metadata_db`, or copied from one that was)."""


@dataclass
class RunOutcome:
    run_id: str
    state: str
    task_states: dict[str, str]
    task_seconds: dict[str, float] = field(default_factory=dict)
    """Each task's seconds over all its tries."""
    task_tries: dict[str, int] = field(default_factory=dict)

    @property
    def caught_up(self) -> bool:
        return self.task_states.get("plan") == "skipped"


@contextmanager
def metadata_db() -> Iterator[None]:
    """Airflow's own metadata DB (sqlite under AIRFLOW_HOME), migrated once, held by this process alone.

    Two runs started together (a scheduled run and a backfill, each `dag.test()` in its own process) would
    both migrate a fresh file ("table ... already exists") and both insert the same new DAG rows ("UNIQUE
    constraint failed: dag.dag_id"); under this file lock the first does it and the other then finds it done.
    """
    import fcntl
    import os

    home = Path(os.environ["AIRFLOW_HOME"])
    marker = home / MIGRATED_MARKER
    with (home / ".microbatch-db-migrate.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                           stdout=subprocess.DEVNULL)
            marker.touch()
        yield


def serve_only_the_current_task_api() -> None:
    """Let `dag.test()`'s in-process Task Execution API serve only the API version its own client speaks.

    The in-process API builds its routes on the first request, for every version in Airflow's bundle (nine in
    Airflow 3.2): about 5 of the 11 CPU-seconds of a `microbatch run` that finds nothing new. Its client (this
    process) always speaks the newest, whose schemas are the head's, so a bundle of that one version serves
    it the same requests and answers. Idempotent; the scheduler's API server is untouched (another process).
    """
    from airflow.api_fastapi.execution_api import routes, versions
    from airflow.sdk.api.datamodels._generated import API_VERSION
    from cadwyn import HeadVersion, Version, VersionBundle
    from fastapi.routing import APIRoute

    newest = versions.bundle.versions[0].value
    if len(versions.bundle.versions) > 1 and newest == API_VERSION:  # else: Airflow's own, slower, bundle
        versions.bundle = VersionBundle(HeadVersion(), Version(newest))
        # Routes that only older versions serve (Cadwyn's marker tag) are not the newest version's.
        routes.execution_api_router.routes[:] = [
            r for r in routes.execution_api_router.routes
            if not (isinstance(r, APIRoute) and "_CADWYN_DELETED_ROUTE" in r.tags)]


DAG_TEST_POLL_SECONDS = 0.1
"""How long `dag.test()`'s loop waits, in `prompt_polls`, when no task is ready (Airflow's own wait: 1 second)."""


@contextmanager
def prompt_polls() -> Iterator[None]:
    """While it lasts, `dag.test()`'s loop waits `DAG_TEST_POLL_SECONDS` instead of a whole second when no task is
    ready to run.

    The loop runs a task only once a pass of `update_state` has found it ready, and sleeps one second after a pass
    that found none: after a plan that finds nothing new, the publish task (`none_failed`) becomes ready only in
    the pass after its upstream tasks were skipped, so every caught-up run of a pipeline with a Kafka sink waited
    a second for nothing, and a retried task up to a second past its retry delay. `time.sleep` is replaced for the
    call from that loop alone (the caller's code is `DAG.test`'s); every other sleep, a task's included, is
    untouched. With an Airflow whose loop no longer sleeps there, this changes nothing.
    """
    import time

    from airflow.sdk.definitions.dag import DAG

    loop = DAG.test.__code__
    sleep = time.sleep

    def poll(seconds: float) -> None:
        caller = sys._getframe(1).f_code
        sleep(min(seconds, DAG_TEST_POLL_SECONDS) if caller is loop else seconds)

    time.sleep = poll
    try:
        yield
    finally:
        time.sleep = sleep


def run_once(pipeline: str, backfill: dict | None = None, maintenance: bool = False) -> RunOutcome:
    """One DAG run of the pipeline (or, with `backfill` params, of its backfill DAG; with `maintenance`, of its
    maintenance DAG), in this process."""
    localenv.apply()
    serve_only_the_current_task_api()
    from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag, sync_dag_files

    if maintenance:
        dag = maintenance_dag(pipeline)
        if dag is None:
            raise SpecError(f"Pipeline '{pipeline}' has no sink that needs maintenance (a lakehouse table), so it has "
                            "no maintenance DAG.",
                            fix="Add a lakehouse sink (e.g. of type delta), or maintain its Postgres tables with your "
                            "own tools.")
    else:
        dag = backfill_dag(pipeline) if backfill is not None else pipeline_dag(pipeline)
    with metadata_db():
        sync_dag_files()  # dag.test() syncs again, then finds every row current: no insert races another run
        if serialize_without_file(dag):  # a spec without its DAG file in dags/
            log.info("%s: no DAG file defines it; serialized the DAG built from its spec", dag.dag_id)
    with prompt_polls():
        dag_run = dag.test(run_conf=backfill)
    # In the order the tasks ran (plan, stage, commit, publish); tasks that never started last.
    instances = sorted(dag_run.get_task_instances(), key=lambda ti: (ti.start_date is None, ti.start_date or 0,
                                                                   ti.task_id))
    states = {ti.task_id: str(ti.state) for ti in instances}
    tries = [(ti.task_id, ti.start_date, ti.end_date) for ti in instances]
    tries += _earlier_tries(dag.dag_id, dag_run.run_id)
    return RunOutcome(dag_run.run_id, str(dag_run.state), states, *task_seconds(tries))


def serialize_without_file(dag: Any) -> bool:
    """Write `dag`, built from its spec, to Airflow's metadata DB when no DAG file has put it there (a spec without
    its thin file in dags/): `dag.test()` creates a DAG run only for a serialized DAG ("Cannot create DagRun ... the
    dag is not serialized") and runs the tasks of the DAG it is given. True when it wrote it; a DAG that has a
    version already (from its file, or from an earlier run) is left as it is."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.models.dag_version import DagVersion
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        if DagVersion.get_latest_version(dag.dag_id, session=session) is not None:
            return False
        bundle = next(iter(DagBundlesManager().get_all_dag_bundles()))
        update_dag_parsing_results_in_db(bundle.name, None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(),
                                         session=session)
    return True


def _earlier_tries(dag_id: str, run_id: str) -> list[tuple[str, datetime | None, datetime | None]]:
    """(task id, start, end) of every failed try before a task's last one, from Airflow's task instance history."""
    from airflow.models.taskinstancehistory import TaskInstanceHistory as History
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(History.task_id, History.start_date, History.end_date)
                               .where(History.dag_id == dag_id, History.run_id == run_id)).all()
    return [tuple(row) for row in rows]


def task_seconds(tries: list[tuple[str, datetime | None, datetime | None]]) -> tuple[dict[str, float],
                                                                                    dict[str, int]]:
    """Each task's seconds added up over all its tries (the waits between them not counted), and its tries."""
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    for task_id, start, end in tries:
        if start and end:
            seconds[task_id] = seconds.get(task_id, 0.0) + (end - start).total_seconds()
            counts[task_id] = counts.get(task_id, 0) + 1
    return seconds, counts


def run_until_caught_up(pipeline: str, max_runs: int = 20,
                        on_outcome: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    """Repeat DAG runs until `plan` finds nothing new (or a run fails, or `max_runs` is reached); `on_outcome` is
    called with each run's outcome as soon as the run ends."""
    outcomes = []
    for _ in range(max_runs):
        outcome = run_once(pipeline)
        outcomes.append(outcome)
        log.info("run %s: %s %s", outcome.run_id, outcome.state, outcome.task_states)
        if on_outcome is not None:
            on_outcome(outcome)
        if outcome.caught_up or outcome.state != "success":
            break
    return outcomes
