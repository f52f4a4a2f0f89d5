"""The one builder of the platform's Spark sessions (`build_session`): a spark-submit driver's (the stage,
maintenance) or a local one, and a Spark Connect client's, with the shared settings (`UTC_SESSION`, the log level);
and the Connect sessions of the stage tasks (`connect_session`, shared by the tasks of one DAG).

No pyspark at import (each function imports it): the CLI and the Airflow tasks import this module cheaply.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from microbatch.spark_remote import bound_retries, is_closed_session, shared_session_id, with_session_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("microbatch.phases.stage")  # the Connect session's line of the stage's own log

UTC_SESSION = {"spark.sql.session.timeZone": "UTC"}
"""The session time zone of every Spark session: a Connect session's over the spec's; a spark-submit's in its
submit conf (`airflow.operators.submit_conf`), where the spec's own setting wins."""
UTC_DRIVER = {"spark.driver.extraJavaOptions": "-Duser.timezone=UTC"}
"""The driver JVM's time zone, for a Spark whose driver this process starts (spark-submit, a local Spark)."""
UTC_EXECUTOR = {"spark.executor.extraJavaOptions": "-Duser.timezone=UTC"}
"""The executors' JVM time zone, for a spark-submit on a cluster."""
LOG_LEVEL = "WARN"
"""The log level of a Spark whose driver runs in this process."""

CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"


def build_session(
    app_name: str | None = None, *, master: str | None = None, remote: str | None = None,
    conf: Mapping[str, str] | None = None, release: bool = True,
) -> SparkSession:
    """A Spark session with the platform's shared settings.

    With `remote` (sc://host:port): a Spark Connect session whose client retries under `spark_remote.CONNECT_RETRY`
    and whose `stop()` releases the server-side session when `release`; the `spark.sql.*` settings of `conf` with
    `UTC_SESSION` over them are set at run time (the only ones a Connect session may change). Else the builder's
    session (`master` and `app_name` when given, `conf` as builder settings: a spark-submit driver takes its own from
    the submit conf) at log level `LOG_LEVEL`."""
    from pyspark.sql import SparkSession

    settings = dict(conf or {})
    if remote is not None:
        spark = SparkSession.builder.remote(remote).create()
        bound_retries(spark)  # before the first call: create() sends none
        spark.release_session_on_close = release  # type: ignore[attr-defined]  # Connect's SparkSession
        try:
            for key, value in {**settings, **UTC_SESSION}.items():
                if key.startswith("spark.sql."):  # the only settings a Connect session may change at run time
                    spark.conf.set(key, value)
        except Exception:
            spark.release_session_on_close = False  # type: ignore[attr-defined]  # nothing to release
            spark.stop()
            raise
        return spark
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    if app_name is not None:
        builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(LOG_LEVEL)
    return spark


@contextmanager
def connect_client_scope() -> Iterator[None]:
    """Unmark this process as a Spark Connect client when the block ends. Building a Connect session sets
    SPARK_CONNECT_MODE_ENABLED=1 in the process environment (pyspark.sql.functions reads it) and nothing unsets
    it; a spark-submit started later by the same process (another DAG's stage in one `microbatch run`, or a
    test) would inherit it, and its driver would take itself for a Connect client."""
    before = os.environ.get(CONNECT_MODE_ENV)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CONNECT_MODE_ENV, None)
        else:
            os.environ[CONNECT_MODE_ENV] = before


def connect_session(remote: str, conf: Mapping[str, str], share_key: str | None = None) -> SparkSession:
    """A Spark Connect session on `remote` (sc://host:port) with the pipeline's SQL settings and a UTC
    session time zone; the server's JVM is already warm, so nothing starts per batch.

    With `share_key` (the DAG id), the session is the server-side session that the DAG's stage tasks share
    (`spark_remote.shared_session_id`), and `stop()` then leaves it open on the server for the next batch. If the
    server has closed that session, this task opens a session of its own, released by `stop()` as before."""
    settings = {**conf, **UTC_SESSION}
    if share_key is not None and "session_id=" not in remote:
        shared = with_session_id(remote, shared_session_id(share_key, settings, time.time()))
        try:
            return build_session(remote=shared, conf=settings, release=False)
        except Exception as exc:
            if not is_closed_session(exc):
                raise
            log.info("the server closed the stage's shared Spark Connect session; this stage opens one of its own")
    return build_session(remote=remote, conf=settings, release=True)


def server_session(spark: SparkSession) -> str:
    """The first 8 characters of the server's id of a Connect session, for the task log: the same id in two
    stage tasks means the second reused the first's warm session."""
    client = getattr(spark, "client", None)
    server_id = getattr(client, "_server_session_id", None) or getattr(spark, "session_id", "")
    return str(server_id)[:8]
