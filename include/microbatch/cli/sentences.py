"""The one sentence `microbatch` prints for an error that stopped a command: the platform's own, an unreachable
ledger or broker, a ledger without its tables, Airflow's busy metadata file, or an unexpected error (its trace in
a file); then exit code 2."""

from __future__ import annotations

import os
import sys
import traceback
from datetime import UTC, datetime

from microbatch import settings
from microbatch.cli.common import _kafka, console
from microbatch.errors import MicrobatchError, error_summary
from microbatch.runtime import cache_dir


def _unexpected(exc: Exception) -> MicrobatchError:
    """One sentence for an error the platform did not expect: its type and message; the trace goes to a file."""
    path = cache_dir() / "logs" / "cli-errors.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(f"--- {datetime.now(UTC).isoformat()} microbatch {(sys.argv[1:] or [''])[0]}\n")
            out.write("".join(traceback.format_exception(exc)))
        where = f"its trace is in {path}"
    except OSError:
        where = "its trace could not be written"
    return MicrobatchError(f"The command stopped on an unexpected error: {error_summary(exc)}.",
                           fix=f"This is microbatch's fault, not yours; {where}: please report it.")


def _sentence(exc: Exception) -> MicrobatchError | None:
    """The one sentence `main` prints for an error that stopped a command, or None for an unexpected one."""
    from kafka.errors import KafkaError
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from microbatch.kafka.offsets import broker_unreachable
    from microbatch.ledger.database import unreachable

    if isinstance(exc, MicrobatchError):
        return exc
    if isinstance(exc, OperationalError):
        return airflow_metadata_error(exc) or unreachable(os.environ.get(settings.LEDGER_URL_ENV, ""), exc)
    if isinstance(exc, ProgrammingError):
        reason = str(exc.orig).strip().splitlines()[0]
        return MicrobatchError(f"The ledger database does not have the tables this needs ({reason}).",
                               fix="Create or upgrade them with `microbatch migrate`.")
    if isinstance(exc, KafkaError):
        kafka = (_kafka() if os.environ.get(settings.BOOTSTRAP_ENV)
                 else settings.KafkaSettings(""))  # where the failing client looked, with its login
        return broker_unreachable(kafka)
    return None


def airflow_metadata_error(exc: Exception) -> MicrobatchError | None:
    """One sentence when a DAG run's failure came from Airflow's own SQLite metadata file, not from the ledger
    (PostgreSQL): two `microbatch run` or `backfill` processes under one AIRFLOW_HOME write that file at once."""
    import sqlite3

    orig = getattr(exc, "orig", None)
    if not isinstance(orig, sqlite3.Error):
        return None
    home = os.environ.get("AIRFLOW_HOME", "AIRFLOW_HOME")
    reason = str(orig).strip().splitlines()[0]
    return MicrobatchError(
        f"Airflow's metadata database in {home} failed: {reason}. Another `microbatch run` or `backfill` process "
        "under the same AIRFLOW_HOME was writing it at the same moment.",
        fix="Run it again (the ledger keeps an unfinished batch, and the next run finishes it), or give concurrent "
        "runs their own AIRFLOW_HOME.")


def _print_error(exc: MicrobatchError) -> None:
    console.print(f"[red]error:[/red] {exc}", highlight=False)
    sys.exit(2)
