"""The `microbatch` Typer app, its commands in the order `--help` lists them, and the console entry point `main`.

`microbatch --help` fits one screen: one line per command (its `short_help` below), grouped in help panels by
purpose; each command's own `--help` keeps its paragraphs (its docstring). `init-db`, the alias of `migrate`, is
reachable but not listed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import typer
from typer.completion import completion_init

from microbatch.cli.common import _quiet_clients
from microbatch.cli.deadletters import dead_letters, reprocess
from microbatch.cli.ledger_repairs import abandon, reland, reset
from microbatch.cli.ledger_views import find, history, metrics, show, state, status, verify
from microbatch.cli.local_stack import airflow, demo
from microbatch.cli.pipelines import backfill, generate, maintain, migrate, new, publish, run, schema
from microbatch.cli.sentences import _print_error, _sentence, _unexpected
from microbatch.dev import localenv

PIPELINES, LEDGER, DEAD_LETTERS, LOCAL_STACK = "Pipelines", "Ledger and audit", "Dead letters", "Local stack"
"""The help panels of `microbatch --help`, in the order it shows them."""

COMMANDS: list[tuple[str, Callable[..., Any], str, str]] = [
    ("new", new, PIPELINES, "Write a new pipeline: spec, transform, test, DAG file."),
    ("migrate", migrate, PIPELINES, "Create or upgrade the ledger, sink tables, topics (init-db)."),
    ("run", run, PIPELINES, "Run the pipeline's DAG until it has caught up with Kafka."),
    ("backfill", backfill, PIPELINES, "Run the pipeline's backfill DAG: fill or replay offsets."),
    ("maintain", maintain, PIPELINES, "Run the pipeline's maintenance DAG (lakehouse tables)."),
    ("publish", publish, PIPELINES, "Publish the pending outbox rows to the Kafka sinks."),
    ("schema", schema, PIPELINES, "Print the JSON Schema of a pipeline spec."),
    ("status", status, LEDGER, "Per partition: position, latest offset, lag, last batch."),
    ("history", history, LEDGER, "Recent batches: kind, state, ranges, counts, seconds."),
    ("find", find, LEDGER, "Which batch processed TOPIC[PARTITION] OFFSET."),
    ("state", state, LEDGER, "The watermark, the job's values and the resets."),
    ("show", show, LEDGER, "The sinks' first rows, counts and totals."),
    ("verify", verify, LEDGER, "Audit the ledger's ranges and every sink's rows."),
    ("metrics", metrics, LEDGER, "Serve the ledger's metrics (Prometheus or OTLP)."),
    ("reset", reset, LEDGER, "Move positions or set the watermark, on the record."),
    ("abandon", abandon, LEDGER, "Close an open batch whose run is gone."),
    ("reland", reland, LEDGER, "Land committed batches again into a sink that lost them."),
    ("dead-letters", dead_letters, DEAD_LETTERS, "List the dead letters: where, key, reason, value."),
    ("reprocess", reprocess, DEAD_LETTERS, "Replay the batches that hold chosen dead letters."),
    ("demo", demo, LOCAL_STACK, "The whole path: services, data, two DAGs, results."),
    ("generate", generate, LOCAL_STACK, "Produce sample nginx access-log lines into a topic."),
    ("airflow", airflow, LOCAL_STACK, "Start the local services and Airflow standalone."),
]
"""(name, function, help panel, the one line `microbatch --help` shows) of every command, in the order listed."""

app = typer.Typer(help="Exactly-once Kafka micro-batches: ledger, data and local stack.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
"""Without Typer's two completion options (five lines of the front page); shell completion stays, through the
environment: `eval "$(_MICROBATCH_COMPLETE=source_bash microbatch)"` (docs/cli.md)."""
completion_init()  # Typer's bash, zsh, fish and PowerShell completion, which add_completion would have registered
for _name, _function, _panel, _line in COMMANDS:
    app.command(_name, short_help=_line, rich_help_panel=_panel)(_function)
    if _name == "migrate":  # its alias: reachable, not listed
        app.command("init-db", help="Alias of migrate.", hidden=True)(migrate)


def main() -> None:
    """The console entry point: connections from the environment, else the running local stack; every
    failure one sentence and exit code 2."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _quiet_clients()
    localenv.apply()
    localenv.use_running_stack()
    try:
        app()
    except Exception as exc:
        _print_error(_sentence(exc) or _unexpected(exc))
