"""What the scheduler's worker processes import once, so that every task process forked from them starts warm.

Airflow runs each task in a process forked from a LocalExecutor worker, and that process imports what the task
needs: the DAG file (the spec, pydantic, the providers), then the phase (SQLAlchemy and kafka-python for plan
and commit; pandas, pyarrow, gRPC and pyspark's Connect client for a Connect stage). Measured on one machine,
that was about 0.6 s for plan, 0.4 s for commit and 1.1 s for the stage, paid again by every batch.

The local stack (`microbatch.dev.airflow`) and docker-compose.yaml start the scheduler with Airflow's own
setting for it, `[scheduler] mp_start_method = forkserver` and `mp_forkserver_preload` naming this module:
the forkserver imports it once, every worker forked from the forkserver inherits the modules, and so does
every task process forked from a worker. Nothing here opens a connection, a gRPC channel or a JVM, so the
forks stay safe. An import that fails here only logs, and the task imports what it needs as before.

Importing this module does the preloading: only the forkserver should (tests check it in a subprocess).
"""

from __future__ import annotations

import gc
import importlib
import logging

log = logging.getLogger(__name__)

MODULES = (
    "pandas",
    "pyarrow",
    "sqlalchemy",
    "psycopg",
    "kafka",
    "microbatch.airflow.dags",
    "microbatch.airflow.operators",
    "microbatch.airflow.lineage",
    "microbatch.kafka.offsets",
    "microbatch.phases.plan",
    "microbatch.phases.commit",
    "microbatch.phases.publish",
    "microbatch.phases.stage",
    "pyspark.sql.connect.session",
)
"""Imported by the forkserver, in this order: a task's own imports, heaviest last."""


def _preload() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the forkserver must start whatever a module does
            log.warning("microbatch preload: %s was not imported (%s); tasks import it themselves", name, exc)
    try:
        # SQLAlchemy configures every mapper of the process at its first ORM query, Airflow's too (which
        # imports all of Airflow's models first): 0.09 s of each plan, stage and commit task, done once here.
        from sqlalchemy.orm import configure_mappers

        configure_mappers()
    except Exception as exc:
        log.warning("microbatch preload: the ORM mappers were not configured (%s); tasks configure them", exc)
    # What is imported now lives as long as the forkserver: moved out of the collector's sight, so a task's full
    # collections do not walk it (about 345,000 objects, 0.16 s per full collection in each task process) and
    # its pages stay shared. Airflow's `fork` path does the same before it forks its workers.
    gc.freeze()


_preload()
