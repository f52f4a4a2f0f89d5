"""The DAG factory: one DAG per pipeline spec, `plan >> stage >> commit`.

This is the only library module that imports Airflow. Building a DAG reads the spec file
and nothing else: connections, the ledger and Kafka are touched only when a task runs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, BaseHook, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSkipException
from sqlalchemy.exc import OperationalError

from microbatch.config import PipelineSpec, encode_spec, find_spec
from microbatch.errors import ConnectionSettingsError, MicrobatchError
from microbatch.kafka.offsets import BOOTSTRAP_ENV
from microbatch.kafka.security import env_from_connection
from microbatch.ledger.database import LEDGER_URL_ENV, unreachable
from microbatch.spark_remote import DEFAULT_PORT, SPARK_REMOTE_ENV

log = logging.getLogger("microbatch")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
RUN_BATCH = PROJECT_ROOT / "spark_jobs" / "run_batch.py"
LEDGER_CONN_ID = "microbatch_ledger"


def ledger_url(conn_id: str = LEDGER_CONN_ID) -> str:
    """The ledger URL: `MICROBATCH_LEDGER_URL`, else the Airflow connection `microbatch_ledger`."""
    if os.environ.get(LEDGER_URL_ENV):
        return os.environ[LEDGER_URL_ENV]
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:
        raise ConnectionSettingsError(
            f"The ledger database is not configured: neither {LEDGER_URL_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=f"Create the connection '{conn_id}' (type postgres) or set {LEDGER_URL_ENV}.",
        ) from None
    return (
        f"postgresql+psycopg://{conn.login or ''}:{conn.password or ''}@{conn.host or '127.0.0.1'}:"
        f"{conn.port or 5432}/{conn.schema or 'postgres'}"
    )


def kafka_bootstrap(conn_id: str) -> str:
    """Bootstrap servers: `MICROBATCH_KAFKA_BOOTSTRAP`, else the Airflow connection `conn_id`."""
    if os.environ.get(BOOTSTRAP_ENV):
        return os.environ[BOOTSTRAP_ENV]
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:
        raise ConnectionSettingsError(
            f"The Kafka cluster is not configured: neither {BOOTSTRAP_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=f"Create the connection '{conn_id}' (type kafka, extra bootstrap.servers) or set {BOOTSTRAP_ENV}.",
        ) from None
    servers = conn.extra_dejson.get("bootstrap.servers") or (f"{conn.host}:{conn.port}" if conn.host else None)
    if not servers:
        raise ConnectionSettingsError(
            f"The Airflow connection '{conn_id}' has no bootstrap servers.",
            fix="Set its extra to {\"bootstrap.servers\": \"HOST:PORT\"}.",
        )
    # The connection's security settings reach every Kafka client of this task, and spark-submit, through
    # the environment (never through arguments); variables set explicitly win.
    for name, value in env_from_connection(conn.extra_dejson, conn.password).items():
        os.environ.setdefault(name, value)
    return servers


def spark_remote(conn_id: str) -> str:
    """The Spark Connect URL: `MICROBATCH_SPARK_REMOTE`, else the Airflow connection `conn_id` (type
    spark_connect), turned into an sc:// URL by the Spark provider's `SparkConnectHook`."""
    if os.environ.get(SPARK_REMOTE_ENV):
        return os.environ[SPARK_REMOTE_ENV]
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        raise ConnectionSettingsError(
            f"The Spark Connect server is not configured: neither {SPARK_REMOTE_ENV} nor the Airflow connection "
            f"'{conn_id}' exists.",
            fix=f"Create the connection '{conn_id}' (type spark_connect, host sc://HOST, port {DEFAULT_PORT}) or set "
            f"{SPARK_REMOTE_ENV}=sc://HOST:PORT.",
        ) from None
    except (AttributeError, TypeError, ValueError):  # no host (the hook calls host.find), or a path in the URL
        raise ConnectionSettingsError(
            f"The Airflow connection '{conn_id}' is not a usable Spark Connect connection: it needs a host and no "
            "path.",
            fix=f"Set its host to sc://HOST (or HOST) and its port to the server's ({DEFAULT_PORT} by default).",
        ) from None


@contextmanager
def task_errors(url: str) -> Iterator[None]:
    """Turn platform and ledger-connection errors into one logged sentence and the right failure."""
    try:
        yield
    except MicrobatchError as exc:
        _fail(exc)
    except OperationalError as exc:
        _fail(unreachable(url, exc))


def _fail(exc: MicrobatchError) -> None:
    """Log the one-sentence cause and fix; retry only what a retry can mend."""
    log.error("%s", exc)
    if exc.retryable:
        raise RuntimeError(str(exc)) from None
    raise AirflowFailException(str(exc)) from None


def sink_assets(spec: PipelineSpec) -> list[Asset]:
    """The Postgres sinks, updated by `commit`."""
    return [
        Asset(name=f"microbatch.{spec.name}.{sink.name}", uri=f"microbatch://{spec.name}/{sink.table}")
        for sink in spec.aggregate_sinks
    ]


def topic_assets(spec: PipelineSpec) -> list[Asset]:
    """The Kafka output topics, updated by `publish`."""
    return [
        Asset(name=f"microbatch.{spec.name}.{sink.name}", uri=f"microbatch://{spec.name}/{sink.name}")
        for sink in spec.kafka_sinks
    ]


class StageBatchOperator(SparkSubmitOperator):
    """spark-submit of `spark_jobs/run_batch.py` for the batch that `plan` chose.

    Connections are resolved when the task runs and reach spark-submit as environment
    variables only, never on its command line.
    """

    def __init__(self, *, spec: PipelineSpec, spark_conf: dict[str, str], **kwargs: Any) -> None:
        conf = {
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.ui.showConsoleProgress": "false",
            **spark_conf,
        }
        super().__init__(
            application=str(RUN_BATCH),
            # The spec travels with the command, so the driver needs no spec file wherever it runs.
            application_args=["--pipeline", spec.name, "--batch-id", "{{ ti.xcom_pull(task_ids='plan') }}",
                              "--spec", encode_spec(spec)],
            name=f"microbatch-{spec.name}",
            conf=conf,
            **kwargs,
        )
        self.pipeline = spec.name
        self.kafka_conn_id = spec.source.connection

    def execute(self, context: Any) -> None:
        from microbatch.runtime import spark_jars

        try:
            env = {
                LEDGER_URL_ENV: ledger_url(),
                BOOTSTRAP_ENV: kafka_bootstrap(self.kafka_conn_id),
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(PROJECT_ROOT / "include"), str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])
                ),
            }
        except MicrobatchError as exc:
            _fail(exc)
        for name in ("MICROBATCH_FAILPOINTS", "MICROBATCH_FAILPOINT_DIR", "PATH", "JAVA_HOME"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        self.env_vars = {**(self.env_vars or {}), **env}
        if not self.jars:
            self.jars = ",".join(str(p) for p in spark_jars())
        # Executors on a cluster import the platform and the job from this zip; local mode finds them anyway.
        self.py_files = ",".join(filter(None, [self.py_files, str(library_zip())]))
        self.conf = {"spark.pyspark.python": sys.executable, **(self.conf or {})}
        super().execute(context)


def library_zip() -> Path:
    """A zip of include/microbatch and spark_jobs for `--py-files`, rebuilt when the code changes."""
    import hashlib
    import zipfile

    from microbatch.runtime import cache_dir

    sources = sorted(
        p for folder in (PROJECT_ROOT / "include" / "microbatch", PROJECT_ROOT / "spark_jobs")
        for p in folder.rglob("*.py") if "__pycache__" not in p.parts
    )
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    target = cache_dir() / "pyfiles" / f"microbatch-{digest}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sources:
                base = PROJECT_ROOT / "include" if path.is_relative_to(PROJECT_ROOT / "include") else PROJECT_ROOT
                archive.write(path, path.relative_to(base))
        partial.replace(target)
    return target


def _default_args(spec: PipelineSpec) -> dict[str, Any]:
    return {
        "retries": spec.retries.count,
        "retry_delay": timedelta(seconds=spec.retries.delay_seconds),
        "owner": "microbatch",
    }


def _stage_task(spec: PipelineSpec) -> Any:
    """The stage task of the spec's `spark.mode`: a spark-submit per batch, or a Spark Connect client."""
    if spec.spark.mode == "connect":
        return _connect_stage_task(spec)
    return StageBatchOperator(
        task_id="stage",
        spec=spec,
        conn_id=spec.spark.connection,
        spark_conf=spec.spark.conf,
    )


def _staged(spec: PipelineSpec, batch_ids: Any) -> Any:
    """The stage task after `plan`, reading plan's batch id(s) from XCom in either mode."""
    stage = _stage_task(spec)
    if isinstance(stage, StageBatchOperator):
        batch_ids >> stage  # its --batch-id argument pulls plan's XCom through a template
        return stage
    return stage(batch_ids)


def _connect_stage_task(spec: PipelineSpec) -> Any:
    """Stage on a long-lived Spark Connect server: this task is the driver-side client, so no JVM starts here."""

    @task(task_id="stage")
    def stage(batch_ids: int | str) -> None:
        from microbatch import spark_remote as connect
        from microbatch.phases.stage import connect_session, stage_batches

        ids = [int(part) for part in str(batch_ids).split(",")]
        try:
            url = ledger_url()
            bootstrap = kafka_bootstrap(spec.source.connection)
            remote = spark_remote(spec.spark.connection)
            connect.check_reachable(remote, spec.spark.connection)
        except MicrobatchError as exc:
            _fail(exc)
        with task_errors(url):
            spark = None
            try:
                spark = connect_session(remote, spec.spark.conf)
                staged = stage_batches(spark, spec, ids, url, bootstrap, log)
            except Exception as exc:
                if not connect.is_unavailable(exc):
                    raise
                spark = None  # releasing the session would retry the lost server for minutes
                reason = "the server went away during the stage (gRPC UNAVAILABLE)"
                raise connect.unreachable(remote, reason, spec.spark.connection) from None
            finally:
                if spark is not None:
                    spark.stop()  # releases this session on the server; the server keeps running
        done = {result.batch_id for result in staged}
        others = [str(i) for i in ids if i not in done]
        log.info("stage %s: staged %s %s through Spark Connect at %s%s", spec.name,
                 "batch" if len(done) == 1 else "batches", ",".join(str(i) for i in ids if i in done) or "none",
                 connect.display(remote), f" ({','.join(others)} already staged or committed)" if others else "")

    return stage


def _commit_task(spec: PipelineSpec) -> Any:
    """The commit task: one transaction per batch id (a comma-separated list for backfills)."""
    assets = sink_assets(spec)

    @task(task_id="commit", outlets=assets)
    def commit(batch_ids: int | str, **context: Any) -> list[dict[str, Any]]:
        from microbatch.failpoints import hit
        from microbatch.kafka.offsets import mirror_group_offsets
        from microbatch.ledger.database import transaction
        from microbatch.phases.commit import commit_batch
        from microbatch.phases.reporting import log_commit_summary

        url = ledger_url()
        summaries = []
        for batch_id in [int(part) for part in str(batch_ids).split(",")]:
            with task_errors(url), transaction(url) as session:
                result = commit_batch(session, spec, batch_id, context.get("run_id"))
            hit("commit.after_commit")
            log_commit_summary(log, spec.name, result)
            if spec.source.commit_group_offsets and result.moves:
                mirror_group_offsets(
                    kafka_bootstrap(spec.source.connection), spec.group_id, {m.tp: m.after for m in result.moves}
                )
            summaries.append({
                "batch_id": result.batch_id,
                "attempt": result.attempt,
                "already_committed": result.already_committed,
                "rows_by_sink": result.rows_by_sink,
                "dead_letters": result.dead_letters,
                "late_records": result.late_records,
                "outbox": {name: list(bounds) for name, bounds in result.outbox.items()},
                "positions": {str(m.tp): m.after for m in result.moves},
            })
        for asset in assets:
            context["outlet_events"][asset].extra = summaries[-1] if len(summaries) == 1 else {"batches": summaries}
        return summaries

    return commit


def _publish_task(spec: PipelineSpec) -> Any:
    # Runs after a skipped (nothing new) run too, so a failed publish is finished by the next run.
    @task(task_id="publish", outlets=topic_assets(spec), trigger_rule="none_failed")
    def publish() -> dict[str, Any]:
        from microbatch.phases.publish import publish_sink
        from microbatch.phases.reporting import log_publish_summary

        url = ledger_url()
        summary = {}
        for sink in spec.kafka_sinks:
            with task_errors(url):
                result = publish_sink(spec, sink, url, kafka_bootstrap(sink.connection))
            log_publish_summary(log, spec.name, result)
            summary[sink.name] = {"first_seq": result.first_seq, "last_seq": result.last_seq,
                                  "records": result.records, "transactions": result.transactions}
        return summary

    return publish


def build_dag(spec: PipelineSpec) -> DAG:
    """The scheduled DAG of one pipeline: plan >> stage >> commit (>> publish with a Kafka sink)."""
    with DAG(
        dag_id=spec.name,
        description=spec.description or f"microbatch pipeline {spec.name}",
        schedule=spec.schedule_value,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args=_default_args(spec),
        tags=["microbatch", *spec.tags],
        doc_md=f"Exactly-once micro-batches of `{', '.join(spec.source.topics) or spec.source.topic_pattern}` into "
        f"`{', '.join(s.name for s in spec.sinks)}`. Spec: `include/pipelines/{spec.name}.yaml`.",
    ) as dag:

        @task(task_id="plan")
        def plan(**context: Any) -> int:
            from microbatch.phases.plan import plan_next_batch
            from microbatch.phases.reporting import log_plan_summary

            url = ledger_url()
            with task_errors(url):
                outcome = plan_next_batch(spec, url, kafka_bootstrap(spec.source.connection), context["run_id"])
            log_plan_summary(log, spec.name, outcome)
            if outcome.batch_id is None:
                raise AirflowSkipException("nothing new to read")
            return outcome.batch_id

        batch_id = plan()
        committed = _commit_task(spec)(batch_id)
        _staged(spec, batch_id) >> committed
        if spec.kafka_sinks:
            committed >> _publish_task(spec)()
    return dag


def build_backfill_dag(spec: PipelineSpec) -> DAG:
    """`<pipeline>__backfill`: not scheduled; a validated trigger form; fill by offsets or times."""
    topics = spec.source.topics
    topic = (Param(topics[0], type="string", enum=topics, description="The topic to backfill.") if topics
             else Param("", type="string", description=f"A topic matching {spec.source.topic_pattern}."))
    params = {
        "topic": topic,
        "partitions": Param("all", type=["string", "array"],
                            description='"all", or a list of partition numbers such as [0, 2].'),
        "start": Param(0, type=["integer", "string"],
                       description="First offset, or an ISO-8601 time (the first offset at or after it)."),
        "end": Param("latest", type=["integer", "string"],
                     description="End offset (exclusive), an ISO-8601 time, or latest (each partition's end)."),
        "mode": Param("fill", type="string", enum=["fill", "replay"],
                      description="fill: only never-committed offsets. replay: recompute committed offsets "
                      "(widened to whole committed batches) and replace their output."),
        "dry_run": Param(False, type="boolean", description="Print the plan and write nothing."),
    }
    with DAG(
        dag_id=f"{spec.name}__backfill",
        description=f"Backfill of microbatch pipeline {spec.name} by offset or time range",
        schedule=None,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args=_default_args(spec),
        params=params,
        tags=["microbatch", "backfill", *spec.tags],
        doc_md=f"Backfill `{spec.name}`: a ledger entry of its own that never moves the scheduled cursor. "
        "Mode `fill` processes only the sub-ranges never committed and below the scheduled position; "
        "mode `replay` recomputes committed ranges and replaces their output in one transaction.",
    ) as dag:

        @task(task_id="plan")
        def plan(**context: Any) -> str:
            from microbatch.phases.backfill import plan_backfill
            from microbatch.phases.reporting import log_backfill_plan

            url = ledger_url()
            with task_errors(url):
                outcome = plan_backfill(spec, dict(context["params"]), url,
                                        kafka_bootstrap(spec.source.connection), context["run_id"])
            log_backfill_plan(log, spec.name, outcome)
            if not outcome.batch_ids:
                raise AirflowSkipException("dry run" if outcome.params.dry_run else f"nothing to {outcome.params.mode}")
            return ",".join(str(b) for b in outcome.batch_ids)

        batch_ids = plan()
        committed = _commit_task(spec)(batch_ids)
        _staged(spec, batch_ids) >> committed
        if spec.kafka_sinks:
            committed >> _publish_task(spec)()
    return dag


def pipeline_dag(name: str) -> DAG:
    """Build the DAG of the pipeline `name`; a bad spec raises here, breaking only this DAG file."""
    return build_dag(find_spec(name))


def backfill_dag(name: str) -> DAG:
    """Build the backfill DAG of the pipeline `name`."""
    return build_backfill_dag(find_spec(name))
