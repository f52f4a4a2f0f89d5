"""The stage task, two ways with one constructor shape: `SubmitStageOperator` runs spark-submit of
`spark_jobs/run_batch.py` per batch, `ConnectStageOperator` is a client of a long-lived Spark Connect
server. `STAGE_OPERATORS` maps `spec.spark.mode` to the class. Both read plan's batch id(s) from XCom
through the same template, and both turn platform errors into the right failure (`task_errors`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, ParamSpec, TypeVar

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sqlalchemy.exc import OperationalError

from microbatch.airflow import hooks
from microbatch.config import PipelineSpec, encode_spec
from microbatch.errors import MicrobatchError, TransientServiceError, error_summary
from microbatch.ledger.database import Ledger
from microbatch.runtime import PROJECT_ROOT, RUN_BATCH, library_zip, spark_jars
from microbatch.settings import LEDGER_URL_ENV, KafkaSettings
from microbatch.sinks.registry import driver_env as sink_driver_env
from microbatch.sinks.registry import spark_session_conf
from microbatch.spark_session import UTC_DRIVER, UTC_EXECUTOR, UTC_SESSION

log = logging.getLogger("microbatch")
CLIENT_MODULES = ("microbatch.phases.stage", "pyspark.sql.connect.session")
"""What a Connect stage task imports; preloaded when the scheduler runs `microbatch.airflow.preload`."""
PLAN_BATCH_IDS = "{{ ti.xcom_pull(task_ids='plan') }}"  # one id, or several joined by commas
# Passed on to spark-submit when set here: failpoints of the chaos tests, and where java and the venv are.
PASSED_ON = ("MICROBATCH_FAILPOINTS", "MICROBATCH_FAILPOINT_DIR", "PATH", "JAVA_HOME")
P = ParamSpec("P")
T = TypeVar("T")


TERMINAL_EXIT = 2
"""The exit code of a spark-submit driver (`spark_jobs/run_batch.py`, `maintain_lake.py`) whose error a retry
cannot mend (a bad spec, data loss under `on_data_loss: fail`): the task fails at once, as on Spark Connect."""


def driver_exit_code(message: str) -> int | None:
    """The exit code of spark-submit in the Spark provider's error message ("... Error code is: 2."), if any."""
    import re

    found = re.search(r"Error code is: (-?\d+)", message)
    return int(found.group(1)) if found else None


def fail(exc: MicrobatchError) -> NoReturn:
    """Log the one-sentence cause and fix; retry only what a retry can mend."""
    log.error("%s", exc)
    if exc.retryable:
        raise RuntimeError(str(exc)) from None
    raise AirflowFailException(str(exc)) from None


CLIENT_LOGGERS = ("kafka", "alembic")
"""Libraries whose INFO lines narrate their own steps (kafka-python every connection: ~20 lines per plan task,
~50 per publish; Alembic its context in plan's schema check); a task log keeps their warnings and errors, and
microbatch's own lines say what was done."""


@contextmanager
def task_errors(ledger: Ledger, step: str = "The task") -> Iterator[None]:
    """The frame of every task's work: client chatter kept out of the task log, and platform and
    ledger-connection errors turned into one logged sentence and the right failure; any other error named in one
    sentence too (the `step`, the exception's type and own message), before Airflow logs its trace."""
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    except MicrobatchError as exc:
        fail(exc)
    except OperationalError as exc:
        fail(ledger.unreachable(exc))
    except Exception as exc:
        log.error("%s failed on an unexpected error: %s; its trace follows in this task's log.", step,
                  error_summary(exc))
        raise


def resolved(resolve: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`resolve(...)` (a connection, a reachability check), its platform error failing the task as `fail` does."""
    try:
        return resolve(*args, **kwargs)
    except MicrobatchError as exc:
        fail(exc)


def batch_id_list(batch_ids: int | str) -> list[int]:
    """Plan's XCom value: a batch id, or several joined by commas."""
    return [int(part) for part in str(batch_ids).split(",")]


def driver_env(ledger: Ledger, kafka: KafkaSettings) -> dict[str, str]:
    """The environment of the spark-submit driver: its connections (never on its command line), this Python
    and the platform's import path."""
    env = {
        LEDGER_URL_ENV: ledger.url,
        **kafka.env(),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(PROJECT_ROOT / "include"), str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    env.update(sink_driver_env())  # resolved here (the warehouse), so the driver writes where verify reads
    return env | {name: os.environ[name] for name in PASSED_ON if os.environ.get(name)}


def submit_conf(spec: PipelineSpec) -> dict[str, str]:
    """The Spark settings of every spark-submit of a pipeline: UTC everywhere, Delta's session extension when
    it has a Delta sink, then the spec's own."""
    return {
        **UTC_SESSION, **UTC_DRIVER, **UTC_EXECUTOR,
        "spark.ui.showConsoleProgress": "false",
        **spark_session_conf(spec),
        **spec.spark.conf,
    }


class SubmitStageOperator(SparkSubmitOperator):
    """spark-submit of `spark_jobs/run_batch.py` for the batch(es) that `plan` chose, on the Spark master of
    `spec.spark.connection`. Connections are resolved when the task runs and reach spark-submit as
    environment variables only, never on its command line."""

    application = RUN_BATCH

    def __init__(self, *, spec: PipelineSpec, batch_ids: str = PLAN_BATCH_IDS, **kwargs: Any) -> None:
        super().__init__(
            application=str(self.application),
            # The spec travels with the command, so the driver needs no spec file wherever it runs.
            application_args=["--pipeline", spec.name, *self.arguments(batch_ids), "--spec", encode_spec(spec)],
            name=f"microbatch-{spec.name}",
            conn_id=spec.spark.connection,
            conf=submit_conf(spec),
            **kwargs,
        )
        self.pipeline = spec.name
        self.kafka_conn_id = spec.source.connection

    def execute(self, context: Any) -> None:
        ledger = resolved(hooks.LedgerHook().get_conn)
        kafka = resolved(hooks.KafkaHook(self.kafka_conn_id).get_conn)
        self.env_vars = {**(self.env_vars or {}), **driver_env(ledger, kafka)}
        if not self.jars:
            self.jars = ",".join(str(p) for p in spark_jars())
        # Executors on a cluster import the platform and the job from this zip; local mode finds them anyway.
        self.py_files = ",".join(filter(None, [self.py_files, str(library_zip())]))
        self.conf = {"spark.pyspark.python": sys.executable, **(self.conf or {})}
        try:
            super().execute(context)
        except Exception as exc:  # the provider's AirflowException for any non-zero exit of spark-submit
            if driver_exit_code(str(exc)) == TERMINAL_EXIT:
                raise AirflowFailException(
                    "The spark-submit driver stopped on a terminal error (exit code 2), whose one sentence and fix "
                    "are the 'failed:' line of the driver's log above; it is not retried, since a retry would fail "
                    "the same way.") from None
            raise


    @staticmethod
    def arguments(batch_ids: str) -> list[str]:
        return ["--batch-id", batch_ids]


class LakeMaintenanceOperator(SubmitStageOperator):
    """spark-submit of `spark_jobs/maintain_lake.py`: each lakehouse sink of the pipeline maintains its table
    (`Sink.maintain`; a Delta table is compacted and vacuumed), on the pipeline's Spark connection, with the same
    jars, settings and environment as its stage."""

    application = PROJECT_ROOT / "spark_jobs" / "maintain_lake.py"

    def __init__(self, *, spec: PipelineSpec, **kwargs: Any) -> None:
        super().__init__(spec=spec, batch_ids="", **kwargs)

    @staticmethod
    def arguments(batch_ids: str) -> list[str]:
        return []


class ConnectStageOperator(BaseOperator):
    """Stage the batch(es) that `plan` chose on the long-lived Spark Connect server of `spec.spark.connection`:
    this task is the driver-side client, so no JVM starts here."""

    template_fields = ("batch_ids",)

    def __init__(self, *, spec: PipelineSpec, batch_ids: str = PLAN_BATCH_IDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.batch_ids = batch_ids

    def execute(self, context: Any) -> None:
        started, warm = time.monotonic(), all(name in sys.modules for name in CLIENT_MODULES)
        from microbatch import spark_remote as connect
        from microbatch.phases.stage import stage_batches
        from microbatch.spark_session import connect_client_scope, connect_session, server_session

        for name in CLIENT_MODULES:  # the session builder imports pyspark's Connect client anyway: timed here
            importlib.import_module(name)
        import_s = time.monotonic() - started
        spec, ids = self.spec, batch_id_list(self.batch_ids)
        ledger = resolved(hooks.LedgerHook().get_conn)
        kafka = resolved(hooks.KafkaHook(spec.source.connection).get_conn)
        remote = resolved(hooks.spark_remote, spec.spark.connection)
        resolved(reachable, remote, spec.spark.connection)
        with task_errors(ledger, "The stage"), connect_client_scope():
            spark = None
            try:
                # The DAG's stage tasks share one warm server-side session (a new one per batch costs ~1 s).
                connecting = time.monotonic()
                spark = connect_session(remote, spec.spark.conf, share_key=self.dag_id)
                log.info("stage %s: Spark Connect client ready in %.2f s (its modules %s, session %.2f s)", spec.name,
                         time.monotonic() - started, "already imported" if warm else
                         f"imported in {import_s:.2f} s", time.monotonic() - connecting)
                staged = stage_batches(spark, spec, ids, ledger, kafka, log)
                session = server_session(spark)
            except Exception as exc:
                if not connect.is_unavailable(exc):
                    raise
                spark = None  # releasing the session would retry the lost server for minutes
                reason = "the server went away during the stage (gRPC UNAVAILABLE)"
                raise connect.unreachable(remote, reason, spec.spark.connection) from None
            finally:
                if spark is not None:
                    spark.stop()  # closes this client; the server keeps running, and keeps a shared session
        done = {result.batch_id for result in staged}
        others = [str(i) for i in ids if i not in done]
        log.info("stage %s: staged %s %s through Spark Connect at %s in session %s%s", spec.name,
                 "batch" if len(done) == 1 else "batches", ",".join(str(i) for i in ids if i in done) or "none",
                 connect.display(remote), session,
                 f" ({','.join(others)} already staged or committed)" if others else "")


def reachable(remote: str, conn_id: str) -> None:
    """Probe the Spark Connect server (one sentence if it is down). The local stack's own server (`make connect`,
    `make demo`), found dead, is started again on its port with its token first; any other server is the user's."""
    from microbatch import spark_remote as connect

    try:
        connect.check_reachable(remote, conn_id)
    except TransientServiceError:
        from microbatch.dev.stack import restart_dead_connect

        if not restart_dead_connect(remote):
            raise
        connect.check_reachable(remote, conn_id)


STAGE_OPERATORS: dict[str, type[SubmitStageOperator] | type[ConnectStageOperator]] = {
    "submit": SubmitStageOperator,
    "connect": ConnectStageOperator,
}
"""`spec.spark.mode` -> the stage operator; each is built as `cls(task_id=..., spec=spec)`."""
