"""What every group of `microbatch` commands shares: the console, the connections from the environment, the
one-sentence refusal, the ledger id of a pipeline, the `--json` and `--log-file` options and a table's printing."""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from microbatch import settings
from microbatch.errors import MicrobatchError, SpecError
from microbatch.runtime import cache_dir

if TYPE_CHECKING:
    from microbatch.ledger.database import Ledger

# Piped output is not cut to 80 columns: tables keep their rows whole for grep and for files.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 0) or 250)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
LogFile = Annotated[Path | None, typer.Option(
    help="The file Airflow's and the tasks' log lines are appended to (default: a new one in .cache/logs/); the "
    "terminal gets only one line per DAG run, and a failed run's cause.")]


def _ledger_url() -> str:
    return settings.ledger_url()  # no lookup: the environment, where use_running_stack() put the local stack


def _ledger() -> Ledger:
    from microbatch.ledger.database import Ledger

    return Ledger(_ledger_url())


def _kafka() -> settings.KafkaSettings:
    return settings.kafka_settings()  # no lookup: the environment (bootstrap servers and security variables)


def _bootstrap() -> str:
    """The broker that `generate` produces to, refused at once if nothing listens there."""
    from microbatch.kafka.offsets import require_listener

    kafka = _kafka()
    require_listener(kafka)
    return kafka.bootstrap_servers


def _fail(exc: MicrobatchError) -> None:
    console.print(f"[red]error:[/red] {exc}", highlight=False)
    raise typer.Exit(2)


def _pipeline_id(session: object, name: str) -> int:
    """The ledger id of pipeline `name`; an unknown name says whether no spec has it or it never ran."""
    from microbatch.config import find_spec
    from microbatch.ledger import queries

    pid = queries.pipeline_id(session, name)  # type: ignore[arg-type]
    if pid is not None:
        return pid
    find_spec(name)  # no such spec: "There is no pipeline 'x' in ... Known pipelines: ..."
    raise MicrobatchError(f"The ledger has no pipeline '{name}' yet: it has never run.",
                          fix=f"Run it first: microbatch run {name}.")


def _partitions_param(text: str) -> str | list[int]:
    """`--partitions`: "all" or a comma-separated list of partition numbers."""
    if text.strip() == "all":
        return "all"
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        numbers = []
    if not numbers or any(n < 0 for n in numbers):
        raise SpecError(f"--partitions '{text}' is not \"all\" or a list of partition numbers.",
                        fix="Give all, or numbers separated by commas, such as 0,2.")
    return numbers


def _quiet_clients() -> None:
    """Kafka client chatter stays out of the CLI's output (failures reach the user as one sentence); again
    after a DAG run, whose logging setup turns it back on."""
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def _run_log_path(name: str) -> Path:
    """A new log file for the DAG runs of `name`, one per process (a run and a backfill may start together)."""
    return cache_dir() / "logs" / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{os.getpid()}.log"


def _print_rows(title: str, columns: list[str], rows: list[tuple]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(value.isoformat(sep=" ") if hasattr(value, "isoformat") else str(value) for value in row))
    console.print(table)
