"""The `microbatch` Typer app, its commands in the order `--help` lists them, and the console entry point `main`."""

from __future__ import annotations

import logging

import typer

from microbatch.cli.common import _quiet_clients
from microbatch.cli.deadletters import dead_letters, reprocess
from microbatch.cli.ledger_repairs import abandon, reland, reset
from microbatch.cli.ledger_views import find, history, metrics, show, state, status, verify
from microbatch.cli.local_stack import airflow, demo
from microbatch.cli.pipelines import backfill, generate, maintain, migrate, new, publish, run, schema
from microbatch.cli.sentences import _print_error, _sentence, _unexpected
from microbatch.dev import localenv

app = typer.Typer(help="Exactly-once Kafka micro-batches: ledger, data and local stack.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.command()(migrate)
app.command("init-db", help="Alias of migrate.")(migrate)
app.command()(generate)
app.command()(run)
app.command()(metrics)
app.command()(maintain)
app.command()(backfill)
app.command()(abandon)
app.command()(reset)
app.command()(state)
app.command()(publish)
app.command()(status)
app.command()(history)
app.command()(find)
app.command("dead-letters")(dead_letters)
app.command()(reprocess)
app.command()(verify)
app.command()(reland)
app.command()(show)
app.command()(schema)
app.command()(new)
app.command()(demo)
app.command()(airflow)


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
