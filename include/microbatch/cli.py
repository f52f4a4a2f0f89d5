"""The `microbatch` operator CLI (Typer + Rich).

Every command finds its connections the same way: the environment first, else the local stack that
`make demo` or `make airflow` started. Every error is one sentence on the cause and the fix, and a
non-zero exit; no traceback. The commands that run a DAG (`run`, `backfill`, `maintain`, `demo`) print one
line per DAG run and a failed run's cause; Airflow's and the tasks' log lines go to a file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from microbatch import settings
from microbatch.dev import localenv
from microbatch.errors import MicrobatchError, SpecError, error_summary
from microbatch.runtime import cache_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from microbatch.config import PipelineSpec
    from microbatch.ledger.database import Ledger
    from microbatch.runner import RunOutcome
    from microbatch.sinks.base import Sink

app = typer.Typer(help="Exactly-once Kafka micro-batches: ledger, data and local stack.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
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


@contextmanager
def _output_to(path: Path) -> Iterator[Console]:
    """Send everything this process and its children print (Airflow's log, spark-submit's) to `path`, appended;
    yields a console that still prints where this process's output went before (the terminal)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("a") as log_file, os.fdopen(os.dup(saved[0]), "w", buffering=1, errors="replace",
                                               encoding=sys.stdout.encoding or "utf-8") as terminal:
        out = Console(file=terminal, soft_wrap=True, width=console.width)  # measured while fd 1 is the terminal
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _quiet_clients() -> None:
    """Kafka client chatter stays out of the CLI's output (failures reach the user as one sentence); again
    after a DAG run, whose logging setup turns it back on."""
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def _run_log_path(name: str) -> Path:
    """A new log file for the DAG runs of `name`, one per process (a run and a backfill may start together)."""
    return cache_dir() / "logs" / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{os.getpid()}.log"


DRIVER_ERROR = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR microbatch[\w.]*: (?P<sentence>.+?)"
                          r"(?: \[[\w.]+\] loc=\S+.*)?$")
"""An ERROR line of a "microbatch" logger in a spark-submit driver (spark_jobs/run_batch.py's format), as it is in
the log: alone, or inside the line of Airflow's SparkSubmitHook that copied it (then followed by that logger's name
and location)."""


def _run_line(outcome: RunOutcome) -> str:
    """A DAG run in one line: its id, its state, and each task's state and seconds (over all its tries, and how many
    when it was retried), in the order the tasks ran."""
    def step(task: str, state: str) -> str:
        seconds = outcome.task_seconds.get(task)
        tries = outcome.task_tries.get(task, 1)
        return f"{task} {state}" + ("" if seconds is None else f" {seconds:.1f}s") + (
            f" in {tries} tries" if tries > 1 else "")

    return f"{outcome.run_id}: {outcome.state} ({', '.join(step(t, s) for t, s in outcome.task_states.items())})"


def run_cause(logged: list[tuple[int, str]], chunk: bytes, start: int) -> str | None:
    """The one-sentence cause of a failed DAG run: the last ERROR line of a "microbatch" logger in it (a task's
    `fail()`). Those written in this process are `logged`, each with the log file's size when it was written; those
    of spark-submit drivers are found in `chunk`, the bytes the run added to the log file from offset `start`.
    None when the run logged no such line."""
    lines = list(logged)
    at = start
    for line in chunk.splitlines(keepends=True):
        found = DRIVER_ERROR.search(line.decode(errors="replace").rstrip())
        if found:
            lines.append((at, found["sentence"]))
        at += len(line)
    return sorted(lines, key=lambda line: line[0])[-1][1].strip() if lines else None


def _no_cause(outcome: RunOutcome) -> str:
    """What a failed run says when none of its tasks logged a one-sentence cause: an unexpected error."""
    failed = [task for task, state in outcome.task_states.items() if state == "failed"]
    what = f"The {' and '.join(failed)} task{'s' if len(failed) > 1 else ''}" if failed else "The DAG run"
    return f"{what} failed on an unexpected error, with no one-sentence cause: its traceback is in the full log."


def _masked(text: str) -> str:
    """`text` with the secrets Airflow masks in its task logs shown as ***, as the log file has them (a process in
    which no task ran has not loaded the masker, and it knows no secret)."""
    masker = sys.modules.get("airflow.sdk._shared.secrets_masker")
    return text if masker is None else str(masker.redact(text))


class _ErrorLines(logging.Handler):
    """The ERROR lines of the "microbatch" loggers in this process, each with `where()`: the log file's size when
    the line was written, so that they can be ordered with the drivers' lines in the file."""

    def __init__(self, where: Callable[[], int]) -> None:
        super().__init__(logging.ERROR)
        self.where = where
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((self.where(), record.getMessage()))
        except Exception:  # a handler never fails the code that logs
            self.handleError(record)


def _log_for(name: str, given: Path | None, doing: str) -> Path:
    """The log file of this command's DAG runs (`given`, else a new one), announced with what is about to run."""
    path = (given or _run_log_path(name)).absolute()
    console.print(f"{doing}; Airflow's task log: {path}", highlight=False, markup=False)
    return path


@contextmanager
def _dag_runs(log_file: Path) -> Iterator[Callable[[RunOutcome], None]]:
    """Airflow's and the tasks' log lines go to `log_file`, never to the terminal. Yields `report`, to be called
    with each DAG run's outcome as the run ends: it prints the run's line and, when the run failed, its cause (the
    last ERROR line microbatch logged in it) and where the full log is. An error that stops the runs leaves its
    traceback in the file and reaches the terminal as one sentence; Ctrl-C exits 130, its traceback in the file."""

    def size() -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        return log_file.stat().st_size

    def log_traceback() -> None:
        size()  # what was written before it, first
        with log_file.open("a") as log:
            log.write(traceback.format_exc())

    with _output_to(log_file) as terminal:
        errors = _ErrorLines(size)
        microbatch_log = logging.getLogger("microbatch")
        microbatch_log.addHandler(errors)
        start = size()

        def report(outcome: RunOutcome) -> None:
            nonlocal start
            end = size()
            terminal.print(_run_line(outcome), highlight=False, markup=False)
            if outcome.state != "success":
                with log_file.open("rb") as log:
                    log.seek(start)
                    cause = run_cause(errors.lines, log.read(max(end - start, 0)), start) or _no_cause(outcome)
                terminal.print(f"[red]error:[/red] {escape(_masked(cause))}", highlight=False)
                terminal.print(f"full log: {log_file}", highlight=False, markup=False)
            errors.lines.clear()
            start = end

        try:
            yield report
        except KeyboardInterrupt:
            log_traceback()
            terminal.print(f"interrupted; full log: {log_file}", highlight=False, markup=False)
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except Exception as exc:
            log_traceback()
            if _sentence(exc) is None:  # main() prints the others' sentence
                raise MicrobatchError(f"The DAG runs stopped on an unexpected error: {error_summary(exc)}.",
                                      fix=f"Its traceback is in {log_file}.") from None
            raise
        finally:
            microbatch_log.removeHandler(errors)


@app.command()
def migrate() -> None:
    """Create or upgrade the ledger schema (Alembic upgrade head), then create the sink tables of every spec in
    the pipelines directory and apply additive changes (a new table, index or nullable column); a destructive
    change is refused with one sentence and nothing is changed."""
    from microbatch.ledger.database import upgrade_ledger
    from microbatch.sinks.schema import migrate_sinks

    url = _ledger_url()
    console.print(f"ledger schema at revision {upgrade_ledger(url)}")
    for pipeline, done in migrate_sinks(url).items():
        console.print(f"{pipeline}: " + ("; ".join(done) if done else "sink tables up to date"))
    for pipeline, done in _migrate_topics().items():
        console.print(f"{pipeline}: " + "; ".join(done))


def _migrate_topics() -> dict[str, list[str]]:
    """Create the missing output topics of every spec in the pipelines directory, as each kafka sink declares."""
    from microbatch.config import load_spec, spec_paths
    from microbatch.kafka.topics import migrate_output_topics

    done = {}
    for path in spec_paths():
        spec = load_spec(path)
        lines = migrate_output_topics(spec, settings.kafka_settings)
        if lines:
            done[spec.name] = lines
    return done


app.command("init-db", help="Alias of migrate.")(migrate)


@app.command()
def generate(
    count: Annotated[int, typer.Option(min=1, help="Number of lines.")] = 10_000,
    topic: str = "ip_count_source",
    partitions: Annotated[int, typer.Option(min=1)] = 4,
    ips: Annotated[int, typer.Option(min=1, help="Distinct client IPs.")] = 50,
    span_seconds: Annotated[int, typer.Option(min=1, help="Event-time span of the lines.")] = 60,
    out_of_order: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of lines moved back in time.")] = 0.1,
    malformed: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of unparseable lines.")] = 0.02,
    seed: int = 7,
) -> None:
    """Produce sample nginx access-log lines into a topic (created if missing); their event times start now,
    or after the topic's latest line, so a second generation is never behind the first's watermark."""
    from microbatch.dev.datagen import generate_lines, next_start, produce_lines
    from microbatch.dev.kafka import create_topic

    bootstrap = _bootstrap()
    create_topic(bootstrap, topic, partitions)
    lines = generate_lines(count, ips=ips, span_seconds=span_seconds, out_of_order=out_of_order,
                           malformed=malformed, seed=seed, start=next_start(bootstrap, topic))
    columns = (TextColumn("producing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        bar = progress.add_task("produce", total=count)
        sent = len(produce_lines(bootstrap, topic, lines, lambda n: progress.advance(bar, n)))
    bad = sum(1 for line in lines if line.malformed)
    console.print(f"produced {sent} lines to {topic} ({bad} malformed)")


@app.command()
def run(
    pipeline: str,
    max_runs: Annotated[int, typer.Option(min=1, help="Stop after this many DAG runs.")] = 20,
    log_file: LogFile = None,
) -> None:
    """Run the pipeline's DAG locally (dag.test) until it has caught up with Kafka. Prints where its log goes, one
    line per DAG run (each task's state and seconds) and, when a run fails, the failed task's one-sentence cause and
    where the full log is (exit code 1). Airflow's and the tasks' log lines, tracebacks included, are in that file
    only."""
    from microbatch.config import find_spec
    from microbatch.runner import run_until_caught_up

    find_spec(pipeline)  # an unknown or bad spec is one sentence, before Airflow starts
    path = _log_for(pipeline, log_file, f"running the {pipeline} DAG until it has caught up")
    with _dag_runs(path) as report:
        outcomes = run_until_caught_up(pipeline, max_runs, on_outcome=report)
    _quiet_clients()
    if outcomes and outcomes[-1].state != "success":
        raise typer.Exit(1)


@app.command()
def metrics() -> None:
    """Serve the ledger's metrics (records read per partition, rows staged, dead and late records, lag, step
    seconds, batches by state, published records and the outbox backlog) through OpenTelemetry: a Prometheus
    endpoint on MICROBATCH_METRICS_HOST:MICROBATCH_METRICS_PORT (127.0.0.1:9464), or OTLP with
    MICROBATCH_METRICS_EXPORTER=otlp. Runs until stopped."""
    import signal as signals

    from microbatch.settings import metrics_settings
    from microbatch.telemetry import start

    settings = metrics_settings()
    url = _ledger_url()
    provider = start(lambda: url, settings)
    where = (f"http://{settings.host}:{settings.port}/metrics" if settings.exporter == "prometheus"
             else "the OTLP endpoint of OTEL_EXPORTER_OTLP_ENDPOINT")
    console.print(f"serving the ledger's metrics at {where}; Ctrl-C stops", highlight=False)
    signals.signal(signals.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        provider.shutdown()


@app.command()
def maintain(pipeline: str, log_file: LogFile = None) -> None:
    """Run the pipeline's maintenance DAG now: each lakehouse sink maintains its table (a Delta table compacts its
    small files, then vacuums the files no retained version needs), the same as triggering
    <pipeline>__maintenance in the UI. Prints as `run` does."""
    from microbatch.config import find_spec
    from microbatch.runner import run_once

    find_spec(pipeline)
    path = _log_for(f"{pipeline}__maintenance", log_file, f"running the {pipeline}__maintenance DAG")
    with _dag_runs(path) as report:
        outcome = run_once(pipeline, maintenance=True)
        report(outcome)
    _quiet_clients()
    if outcome.state != "success":
        raise typer.Exit(1)


@app.command()
def backfill(
    pipeline: str,
    topic: Annotated[str, typer.Option(help="The topic to backfill.")],
    start: Annotated[str, typer.Option(help="First offset, or an ISO-8601 time.")],
    end: Annotated[str, typer.Option(help="End offset (exclusive), an ISO-8601 time, or latest.")],
    partitions: Annotated[str, typer.Option(help='"all" or a comma-separated list, e.g. 0,2.')] = "all",
    mode: Annotated[str, typer.Option(
        help="fill (only never-committed offsets) or replay (recompute committed offsets, replace their output).",
    )] = "fill",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.")] = False,
    log_file: LogFile = None,
) -> None:
    """Run the pipeline's backfill DAG (the same as triggering <pipeline>__backfill in the UI). Prints as `run` does:
    where its log goes, the DAG run's line and, when it fails, its cause and where the full log is (exit code 1)."""
    from microbatch.config import find_spec
    from microbatch.phases.backfill import form_params, parse_params, plan_backfill
    from microbatch.phases.reporting import log_backfill_plan
    from microbatch.runner import run_once

    chosen = _partitions_param(partitions)
    params = form_params(topic, start, end, chosen if chosen == "all" else ", ".join(map(str, chosen)), mode,
                         dry_run)
    spec = find_spec(pipeline)
    parse_params(spec, params)  # refuse bad parameters before anything runs
    if dry_run:  # the plan alone: computed here, as the backfill DAG's plan task would, and nothing written
        plan_log = logging.getLogger("microbatch.cli.plan")
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        plan_log.addHandler(handler)
        plan_log.setLevel(logging.INFO)
        plan_log.propagate = False
        log_backfill_plan(plan_log, pipeline, plan_backfill(spec, params, _ledger(), _kafka()))
        return
    path = _log_for(f"{pipeline}__backfill", log_file, f"running the {pipeline}__backfill DAG")
    with _dag_runs(path) as report:
        outcome = run_once(pipeline, backfill=params)
        report(outcome)
    _quiet_clients()
    if outcome.state != "success":
        raise typer.Exit(1)


@app.command()
def abandon(
    pipeline: str,
    batch: Annotated[int, typer.Argument(min=1, help="The open batch id (see `microbatch history`).")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Close an open (planned or staged) batch whose run is gone, so its ranges can be planned again."""
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
    if not yes and not typer.confirm(f"Abandon batch {batch} of {pipeline}? Its staged work is discarded."):
        raise typer.Exit(1)
    with transaction(_ledger_url()) as session:
        was = repo.abandon_open_batch(session, pid, batch, "abandoned by an operator (microbatch abandon)")
        followers = [] if was is None else repo.abandon_followers(session, pid, batch, "abandoned by an operator")
    if was is None:
        _fail(MicrobatchError(f"Batch {batch} of {pipeline} is not open (planned or staged); nothing changed.",
                              fix="See `microbatch history` for its state."))
    console.print(f"batch {batch} of {pipeline}: {was} -> abandoned; its ranges can be planned again")
    if followers:
        console.print(f"batch(es) {', '.join(map(str, followers))}, planned after it in the same run, -> abandoned "
                      "too: each started where the one before ends")


@app.command()
def reset(
    pipeline: str,
    to: Annotated[str | None, typer.Option("--to", help="earliest, latest, offset or timestamp.")] = None,
    value: Annotated[str | None, typer.Option(help="The offset, or the ISO-8601 time.")] = None,
    topic: Annotated[str | None, typer.Option(help="One topic; all of the pipeline's when omitted.")] = None,
    partition: Annotated[int | None, typer.Option(min=0, help="One partition; all when omitted.")] = None,
    watermark: Annotated[str | None, typer.Option(
        help="Instead of positions: 'clear', or an ISO-8601 time with a zone, as the pipeline's watermark.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would change; write nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Move positions, or set or clear the watermark, once, on the record: refused while a batch is open; skipped
    offsets become a gap."""
    import getpass

    from microbatch.config import find_spec
    from microbatch.phases.reset import apply_reset, check_target, plan_reset

    if (to is None) == (watermark is None):
        raise SpecError("reset takes either --to (positions) or --watermark (the pipeline's state).",
                        fix="Give one of them, e.g. --to latest, or --watermark clear.")
    if watermark is not None:
        _reset_watermark(pipeline, watermark, dry_run, yes)
        return
    assert to is not None
    check_target(to, value)  # a bad --to or --value is refused before anything is looked up
    spec = find_spec(pipeline)
    plan = plan_reset(spec, to, value, topic, partition, _kafka(), _ledger())
    if not plan.moves:
        console.print("nothing to change: every position is already there")
        return
    table = Table(title=f"{pipeline}: reset --to {to}")
    for column in ("partition", "from", "to", "skipped offsets"):
        table.add_column(column)
    for m in plan.moves:
        table.add_row(str(m.tp), "-" if m.old is None else str(m.old), str(m.new), str(m.skipped))
    console.print(table)
    if dry_run:
        return
    if not yes and not typer.confirm("Apply this reset?"):
        raise typer.Exit(1)
    apply_reset(spec, plan, _ledger(), getpass.getuser())
    console.print(f"reset applied to {len(plan.moves)} partition(s); skipped offsets are recorded as gaps")


def _reset_watermark(pipeline: str, target: str, dry_run: bool, yes: bool) -> None:
    import getpass

    from microbatch.config import find_spec
    from microbatch.phases.reset import WATERMARK_KEYS, apply_watermark, plan_watermark, time_text

    plan = plan_watermark(find_spec(pipeline), target, _ledger())
    if plan.old == plan.new:
        console.print(f"{pipeline}: nothing to change: the state already is what --watermark {target} makes")
        return
    for key in WATERMARK_KEYS:
        before, after = plan.old.get(key), plan.new.get(key)
        console.print(f"{pipeline}: {key.removesuffix('_us')}: {time_text(before) if before is not None else 'none'}"
                      f" -> {time_text(after) if after is not None else 'none (the next batch starts it again)'}")
    if dry_run:
        return
    if not yes and not typer.confirm("Apply this reset?"):
        raise typer.Exit(1)
    apply_watermark(plan, _ledger(), getpass.getuser())
    console.print(f"{pipeline}: the watermark reset is applied and recorded (`microbatch state {pipeline}`)")


@app.command()
def state(pipeline: str, as_json: JsonFlag = False) -> None:
    """The pipeline's state on the record: the watermark and the job's values, which committed batch last changed
    each, and the operators' resets."""
    from microbatch.ledger.database import transaction
    from microbatch.ledger.state import state_view
    from microbatch.phases.reset import time_text

    with transaction(_ledger_url()) as session:
        view = state_view(session, _pipeline_id(session, pipeline))
    shown = {key: time_text(value) if key.endswith("_us") else value for key, value in view.state.items()}
    if as_json:
        print(json.dumps({"state": view.state, "shown": shown,
                          "changed_by": {k: {"batch_id": c.batch_id, "committed_at": str(c.committed_at)}
                                         for k, c in view.changed_by.items()},
                          "resets": [{"target": r.target, "operator": r.operator, "at": str(r.created_at),
                                      "old": r.old_state, "new": r.new_state} for r in view.resets]}, default=str))
        return
    rows = [(key.removesuffix("_us"), str(shown[key]),
             f"batch {view.changed_by[key].batch_id}" if key in view.changed_by else "-",
             view.changed_by[key].committed_at or "" if key in view.changed_by else "") for key in sorted(view.state)]
    _print_rows(f"{pipeline}: state ({'empty: no batch set it yet' if not rows else f'{len(rows)} value(s)'})",
                ["value", "now", "last changed by", "at"], rows)
    for r in view.resets:
        console.print(f"  reset {r.target} by {r.operator or 'unknown'} at {r.created_at:%Y-%m-%d %H:%M:%S}")


@app.command()
def publish(pipeline: str) -> None:
    """Publish the pipeline's pending outbox rows to its Kafka sinks (what the publish task does)."""
    from microbatch.config import find_spec
    from microbatch.phases.publish import publish_sink
    from microbatch.sinks.registry import publishing

    spec = find_spec(pipeline)
    for sink in publishing(spec):
        result = publish_sink(spec, sink.spec, _ledger(), _kafka())
        console.print(f"{sink.name}: sequences {result.first_seq}..{result.last_seq} published "
                      f"({result.records} records, {result.transactions} transactions) to {result.topic}")


def _latest_offsets(name: str) -> dict:
    """Latest offsets of the pipeline's partitions, or {} with a warning when Kafka is unreachable."""
    from microbatch.config import find_spec
    from microbatch.kafka.offsets import offset_bounds, offsets_client, source_partitions

    try:
        spec = find_spec(name)
        with offsets_client(_kafka(), spec.source.isolation_level) as consumer:
            return offset_bounds(consumer, source_partitions(consumer, spec.source))[1]
    except MicrobatchError as exc:
        console.print(f"[yellow]warning:[/yellow] latest offsets unavailable: {exc}")
        return {}


@app.command()
def status(
    pipeline: Annotated[str | None, typer.Argument(help="One pipeline; all when omitted.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Per partition: the position, the latest offset, the lag, the last batch and its age."""
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        names = [pipeline] if pipeline else queries.pipeline_names(session)
        report = {name: queries.partition_status(session, _pipeline_id(session, name), _latest_offsets(name))
                  for name in names}
    if as_json:
        print(json.dumps({name: [queries.to_dict(r) for r in rows] for name, rows in report.items()}))
        return
    if not report:
        console.print("the ledger has no pipeline yet: run one with `microbatch run NAME`")
    for name, rows in report.items():
        total = sum(r.lag or 0 for r in rows)
        table = Table(title=f"{name}: total lag {total}")
        for column in ("partition", "position", "latest", "lag", "last batch", "committed ago"):
            table.add_column(column, justify="left" if column == "partition" else "right")
        for r in rows:
            age = "-" if r.last_commit_age_s is None else f"{r.last_commit_age_s:.0f}s"
            table.add_row(f"{r.topic}[{r.partition}]", *(str("-" if v is None else v) for v in
                          (r.position, r.latest, r.lag, r.last_batch_id)), age)
        console.print(table)


def _runs_text(planned: str | None, committed: str | None) -> str:
    """The Airflow run of a batch; both runs when a later run committed what an earlier one planned."""
    if committed and committed != planned:
        return f"planned by {planned or '-'}, committed by {committed}"
    return planned or committed or "-"


@app.command()
def history(pipeline: str, limit: Annotated[int, typer.Option(min=1)] = 20, as_json: JsonFlag = False) -> None:
    """Recent batches: kind, state, ranges, counts, each step's seconds and the Airflow run(s)."""
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction
    from microbatch.ledger.models import BatchState

    with transaction(_ledger_url()) as session:
        batches = queries.batch_history(session, _pipeline_id(session, pipeline), limit)
    if as_json:
        print(json.dumps([queries.to_dict(b) for b in batches]))
        return
    table = Table(title=f"{pipeline}: last {len(batches)} batches")
    for column in ("batch", "kind", "state", "try", "ranges", "records", "dead", "late", "seconds", "airflow run"):
        table.add_column(column)
    for b in batches:
        seconds = queries.step_seconds_text(b.durations)
        error = f" ({b.error})" if b.error and b.state != BatchState.COMMITTED else ""
        table.add_row(str(b.id), b.kind, b.state + error,
                      str(b.attempt), b.ranges_text, str(b.records if b.records is not None else "-"),
                      str(b.dead_letters or 0), str(b.late_records or 0), seconds,
                      _runs_text(b.airflow_run_id, b.committed_run_id))
    console.print(table)


@app.command()
def find(
    pipeline: str,
    topic: str,
    partition: Annotated[int, typer.Argument(min=0)],
    offset: Annotated[int, typer.Argument(min=0)],
    as_json: JsonFlag = False,
) -> None:
    """Which batch and Airflow run processed TOPIC[PARTITION] OFFSET, or which gap recorded it as lost."""
    from microbatch.ledger import lake, queries
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
        positions = repo.read_positions(session, pid)
        owner = queries.find_offset(session, pid, topic, partition, offset)
        held = lake.lake_versions_of_batch(session, pid, owner.batch_id) if owner.kind == "batch" else {}
    read = sorted({tp.topic for tp in positions})
    if topic not in read:
        raise SpecError(f"Pipeline '{pipeline}' has never read a topic '{topic}' (it has read "
                        f"{', '.join(read) or 'nothing yet'}).", fix="Check the topic name.")
    known = sorted(tp.partition for tp in positions if tp.topic == topic)
    if partition not in known:
        raise SpecError(f"Pipeline '{pipeline}' has never read partition {partition} of {topic} (it has read "
                        f"partitions {', '.join(map(str, known))}).", fix="Check the partition number.")
    if as_json:
        print(json.dumps({**queries.to_dict(owner), "tables": {s: {"location": loc, "version": v}
                                                               for s, (loc, v) in held.items()}}))
    elif owner.kind == "batch":
        console.print(f"{topic}[{partition}] offset {offset} was processed by batch {owner.batch_id} "
                      f"(range [{owner.start}, {owner.end}), Airflow run {owner.airflow_run_id})"
                      + (f": dead letter: {owner.dead_letter}" if owner.dead_letter else ""))
        sinks = _sinks_or_none(pipeline)
        for sink, (loc, version) in held.items():
            text = sinks[sink].holding_text(loc, version) if sink in sinks else f"{sink}: in version {version} of {loc}"
            console.print(f"  {text}")
    elif owner.kind == "gap":
        console.print(f"{topic}[{partition}] offset {offset} was lost: gap [{owner.start}, {owner.end}) "
                      f"recorded by {f'batch {owner.batch_id}' if owner.batch_id else 'an operator'}: {owner.reason}")
    else:
        position = next(p for tp, p in positions.items() if tp.topic == topic and tp.partition == partition)
        console.print(f"{topic}[{partition}] offset {offset} has not been processed yet (the position is {position})")
    if owner.kind == "none":
        raise typer.Exit(1)


def _sinks_or_none(pipeline: str) -> dict[str, Sink]:
    """The pipeline's sinks by name, or none when its spec is gone (the ledger outlives it)."""
    from microbatch.config import find_spec
    from microbatch.sinks.registry import sinks_of

    try:
        return sinks_of(find_spec(pipeline))
    except SpecError:
        return {}


BatchFilter = Annotated[int | None, typer.Option("--batch", help="Only the dead letters of this batch.")]
TopicFilter = Annotated[str | None, typer.Option(help="Only this topic.")]
PartitionFilter = Annotated[int | None, typer.Option(min=0, help="Only this partition.")]
SinceFilter = Annotated[str | None, typer.Option(help="Records at or after this ISO-8601 time (Kafka timestamp).")]
UntilFilter = Annotated[str | None, typer.Option(help="Records before this ISO-8601 time (Kafka timestamp).")]
ReasonFilter = Annotated[str | None, typer.Option(help="Only reasons that contain this text (any case).")]


def _dead_letters(pipeline: str, batch: int | None, topic: str | None, partition: int | None, since: str | None,
                  until: str | None, reason: str | None, limit: int | None) -> list:
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction
    from microbatch.phases.reset import parse_time

    times = {name: parse_time(value) if value else None for name, value in (("since", since), ("until", until))}
    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
        return queries.dead_letters(session, pid, batch_id=batch, topic=topic, partition=partition, reason=reason,
                                    limit=limit, **times)


def _preview(data: bytes | None, width: int = 40) -> str:
    """The start of a key or value as text (bytes that are not UTF-8 shown escaped), for a table cell."""
    if data is None:
        return "null"
    shown = data.decode("utf-8", errors="backslashreplace")
    return shown if len(shown) <= width else shown[: width - 1] + "…"


@app.command("dead-letters")
def dead_letters(
    pipeline: str, batch: BatchFilter = None, topic: TopicFilter = None, partition: PartitionFilter = None,
    since: SinceFilter = None, until: UntilFilter = None, reason: ReasonFilter = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, by topic, partition and offset.")] = 100,
    as_json: JsonFlag = False,
) -> None:
    """The pipeline's dead letters: where each record is, its key, timestamp and reason, and the start of its value.
    After a fix of the transform or the spec, `microbatch reprocess` replays the batches that hold them."""
    rows = _dead_letters(pipeline, batch, topic, partition, since, until, reason, limit)
    if as_json:
        print(json.dumps([{"batch_id": r.batch_id, "topic": r.topic, "partition": r.partition, "offset": r.offset,
                           "key": _preview(r.key, 10_000), "reason": r.error, "value": _preview(r.value, 10_000),
                           "timestamp": r.timestamp.isoformat() if r.timestamp else None} for r in rows]))
        return
    _print_rows(f"{pipeline}: {len(rows)} dead letter(s)" + (f" (the first {limit})" if len(rows) == limit else ""),
                ["batch", "topic", "partition", "offset", "key", "timestamp", "reason", "value"],
                [(r.batch_id, r.topic, r.partition, r.offset, _preview(r.key, 20), r.timestamp or "", r.error,
                  _preview(r.value)) for r in rows])


@app.command()
def reprocess(
    pipeline: str, batch: BatchFilter = None, topic: TopicFilter = None, partition: PartitionFilter = None,
    since: SinceFilter = None, until: UntilFilter = None, reason: ReasonFilter = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ranges and counts; write nothing.")] = False,
    log_file: LogFile = None,
) -> None:
    """Re-process the chosen dead letters after a fix: replay exactly the committed ranges that hold them (one replay
    per range, from its batch's state, as `backfill --mode replay`). Every sink must take replays; a record that is
    valid now but whose window was already final when its batch began becomes a late record."""
    from microbatch.config import find_spec
    from microbatch.phases.backfill import form_params, plan_backfill
    from microbatch.runner import run_once

    letters = _dead_letters(pipeline, batch, topic, partition, since, until, reason, None)
    if not letters:
        console.print(f"{pipeline}: no dead letter matches; nothing to re-process")
        return
    ranges: dict[tuple[str, int, int, int], list] = {}
    for letter in letters:
        ranges.setdefault((letter.topic, letter.partition, letter.range_start, letter.range_end), []).append(letter)
    requests = [form_params(t, str(start), str(end), str(p), "replay", dry_run=False)
                for (t, p, start, end) in ranges]
    spec = find_spec(pipeline)
    for request in requests:  # refuse before anything runs: a sink that cannot replay, a range now open
        plan_backfill(spec, {**request, "dry_run": True}, _ledger(), _kafka())
    _print_rows(f"{pipeline}: {len(letters)} dead letter(s) in {len(ranges)} committed range(s) to replay",
                ["topic", "partition", "range", "batch", "dead letters"],
                [(t, p, f"[{start}, {end})", held[0].batch_id, len(held))
                 for (t, p, start, end), held in ranges.items()])
    if dry_run:
        return
    path = _log_for(f"{pipeline}__backfill", log_file, f"re-processing with the {pipeline}__backfill DAG")
    with _dag_runs(path) as report:
        for request in requests:
            outcome = run_once(pipeline, backfill={**request, "dry_run": False})
            report(outcome)
            if outcome.state != "success":
                break
    _quiet_clients()
    if outcome.state != "success":
        raise typer.Exit(1)
    left = _dead_letters(pipeline, batch, topic, partition, since, until, reason, None)
    console.print(f"{pipeline}: re-processed {len(ranges)} range(s); {len(letters) - len(left)} of {len(letters)} "
                  f"dead letter(s) are now rows or late records, {len(left)} remain (`microbatch dead-letters "
                  f"{pipeline}` lists them)")


@app.command()
def verify(pipeline: str, as_json: JsonFlag = False) -> None:
    """Audit the ledger: committed ranges and gaps cover every offset up to each position, no overlap; each
    lakehouse table holds every committed batch in exactly one version, and no other batch; and every sink holds
    the rows the ledger committed for each batch (`microbatch reland` lands a batch that lost them again)."""
    from microbatch.config import find_spec
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction
    from microbatch.phases.audit import audit_rows
    from microbatch.planning import find_holes, find_overlaps
    from microbatch.sinks.registry import sinks_of

    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
        ranges = repo.committed_ranges(session, pid)
        gaps = repo.committed_gaps(session, pid)
        positions = repo.read_positions(session, pid)
        try:
            spec = find_spec(pipeline)
        except SpecError:  # the ledger outlives a removed spec; its offsets are still audited
            spec = None
        lake_lines: list[str] = []
        lake_problems: list[str] = []
        sinks = sinks_of(spec) if spec is not None else {}
        for sink in sinks.values():
            if sink.lake_location is not None:
                try:
                    lines, found = sink.audit(session, spec, pid, repo.pipeline_uid(session, pid))
                except MicrobatchError as exc:
                    lines, found = [], [f"{sink.type} {sink.name}: {exc}"]
                except Exception as exc:  # a table that cannot be read is a finding, not a traceback
                    lines, found = [], [f"{sink.type} {sink.name}: its table cannot be read ({error_summary(exc)})"]
                lake_lines += lines
                lake_problems += found
        rows = audit_rows(session, pipeline, pid, sinks)
    problems = [f"overlap: {a} and {b}" for a, b in find_overlaps(ranges)] + find_holes(ranges, gaps, positions)
    problems += lake_problems + rows.problems
    lake_lines += rows.lines
    if as_json:
        print(json.dumps({"ok": not problems, "ranges": len(ranges), "gaps": len(gaps), "tables": lake_lines,
                          "problems": problems}))
    elif problems:
        for problem in problems:
            console.print(f"[red]violation[/red] {problem}")
    else:
        console.print(f"ok: {len(ranges)} committed ranges and {len(gaps)} gaps cover {len(positions)} partitions "
                      "with no hole and no overlap")
        for line in lake_lines:
            console.print(f"ok: {line}")
    if problems:
        raise typer.Exit(1)


@app.command()
def reland(
    pipeline: str,
    sinks: Annotated[list[str], typer.Argument(
        help="The append sink(s) (a Postgres or lakehouse append table) to land into, each on its own.")],
    batch: Annotated[list[int] | None, typer.Option(
        "--batch", help="A committed batch to land again (repeatable); default: those verify names.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batches; write nothing.")] = False,
) -> None:
    """Land committed batches again into an append sink whose table lost their rows: each batch's committed ranges
    are read and transformed as its stage did, and replace the rows of those ranges in that sink in one table commit,
    recorded in the ledger. Sinks not named, offsets and state are untouched."""
    from microbatch.config import find_spec
    from microbatch.ledger.database import transaction
    from microbatch.phases.audit import audit_rows
    from microbatch.phases.reland import reland_batches, relandable

    spec = find_spec(pipeline)
    targets = {sink: relandable(spec, sink) for sink in dict.fromkeys(sinks)}
    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
        lost = audit_rows(session, pipeline, pid, targets).lost
    chosen = {sink: sorted(set(batch)) if batch else lost.get(sink, []) for sink in targets}
    for sink, batches in chosen.items():
        console.print(f"{pipeline}: relanding {len(batches)} batch(es) into {sink}: {', '.join(map(str, batches))}"
                      if batches else f"{pipeline}: sink {sink} holds the rows of every committed batch; nothing to "
                      "reland")
    if dry_run or not any(chosen.values()):
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with _reland_session(spec) as spark:
        for sink, batches in chosen.items():
            for one in reland_batches(spark, spec, targets[sink], batches, _ledger(), _kafka()):
                version = f" as version {one.version}" if one.version is not None else ""
                console.print(f"  batch {one.batch_id}: {one.rows} rows landed in {sink}{version} ({one.seconds:.1f}s)")
    with transaction(_ledger_url()) as session:
        left = audit_rows(session, pipeline, pid, targets).lost
    for sink in targets:
        console.print(f"{pipeline}: sink {sink} " + (f"still differs from the ledger in batches {left[sink]}"
                                                      if left.get(sink) else
                                                      "now holds the rows the ledger committed for every batch"))
    if left:
        raise typer.Exit(1)


@contextmanager
def _reland_session(spec: PipelineSpec) -> Iterator[SparkSession]:
    """The Spark a reland runs on: the pipeline's Spark Connect server in mode connect (or auto with one set),
    else a local Spark in this process with the platform's jars."""
    from microbatch.phases.stage import connect_client_scope, connect_session
    from microbatch.runtime import spark_jars
    from microbatch.sinks.registry import spark_session_conf

    mode = spec.spark.resolved(settings.spark_remote_set())
    if mode.mode == "connect":
        with connect_client_scope():
            spark = connect_session(settings.spark_remote(mode.connection), spec.spark.conf)
            try:
                yield spark
            finally:
                spark.stop()
        return
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(f"microbatch-{spec.name}-reland")
    conf = {"spark.sql.session.timeZone": "UTC", "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.ui.enabled": "false", "spark.jars": ",".join(str(p) for p in spark_jars()),
            **spark_session_conf(spec), **spec.spark.conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        spark.stop()


@app.command()
def show(
    pipeline: str,
    sink: Annotated[str | None, typer.Argument(help="One sink of the pipeline; every sink when omitted.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Rows to print per sink.")] = 15,
    count_by: Annotated[str | None, typer.Option(help="Delta sinks: rows per value of this column instead.")] = None,
) -> None:
    """The pipeline's sinks, in spec order, or SINK only: a table's first rows (the largest sums of an aggregate,
    the newest rows of a row sink or a Delta table), its row count and totals, and the pipeline's dead letters and
    late records; a Kafka sink's newest published records and how many of those its commits wrote were
    published."""
    from microbatch.config import find_spec
    from microbatch.sinks.registry import sinks_of

    spec = find_spec(pipeline)
    shown = [s for s in sinks_of(spec).values() if s.table is not None or s.lake_location is not None or s.publishes]
    chosen = [s for s in shown if s.name == sink] if sink else shown
    if not chosen:
        raise SpecError(f"Pipeline '{pipeline}' has no sink '{sink}'.",
                        fix=f"Use one of: {', '.join(s.name for s in shown) or 'none'}.")
    for one in chosen:
        if one.view_order is not None:
            _show_table(pipeline, one, limit)
        elif one.lake_location is not None:
            _show_lake(one, limit, count_by)
        else:
            _show_published(pipeline, one, limit)


def _show_table(pipeline: str, sink: Sink, limit: int) -> None:
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction

    assert sink.table is not None and sink.view_order is not None
    order, sums = sink.view_order
    with transaction(_ledger_url()) as session:
        view = queries.sink_view(session, _pipeline_id(session, pipeline), sink.table, order, sums, limit)
    totals = "".join(f", sum of {column} {value}" for column, value in view.sums.items())
    _print_rows(f"{sink.name} ({sink.type}): {view.total_rows} rows{totals}; {view.dead_letters} dead "
                f"letters, {view.late_records} late records", view.columns, view.rows)


def _show_published(pipeline: str, sink: Sink, limit: int) -> None:
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        view = queries.published_view(session, _pipeline_id(session, pipeline), sink.name, limit)
    pending = view.written - view.published
    _print_rows(f"{sink.name} ({sink.type}, topic {sink.published_topic}): {view.published} records published in "
                f"{view.transactions} transaction(s), {pending} waiting in the outbox; newest published",
                view.columns, view.rows)


def _print_rows(title: str, columns: list[str], rows: list[tuple]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(value.isoformat(sep=" ") if hasattr(value, "isoformat") else str(value) for value in row))
    console.print(table)


def _show_lake(sink: Sink, limit: int, count_by: str | None) -> None:
    view = sink.lake_view(limit, count_by)
    assert view is not None, "a sink with a lake_location has a lake_view"
    query = f"rows per {count_by}" if count_by else "newest rows"
    _print_rows(f"{sink.name} ({sink.type}, read by {view.reader}): {view.total_rows} rows in version "
                f"{view.version} of {view.location}, {view.files} files; {query}", view.columns, view.rows)


@app.command()
def schema() -> None:
    """Print the JSON Schema of a pipeline spec, from its pydantic models (for editors that check specs)."""
    from microbatch.config import PipelineSpec

    print(json.dumps(PipelineSpec.model_json_schema(), indent=2))


@app.command()
def new(
    name: str,
    topic: Annotated[str | None, typer.Option(help="The Kafka topic the pipeline reads (with --format and "
                                                   "--columns).")] = None,
    from_topic: Annotated[str | None, typer.Option(
        "--from-topic", help="Sample up to 100 records of this live topic and infer a YAML-only pipeline from them: "
        "the key's and value's formats (json with typed fields, text or raw) and one postgres_append sink with a "
        "sql query; no transform.")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="json: each record a JSON object; text: one line. "
                                            "Default json.")] = None,
    columns: Annotated[str | None, typer.Option(help="json: NAME:TYPE pairs, e.g. id:text,amount:bigint.")] = None,
) -> None:
    """Write a new pipeline that runs as generated: its spec, transform, unit test and DAG file; or, with
    --from-topic, its spec (formats and a SQL sink inferred from the topic's records), unit test and DAG file."""
    from microbatch import scaffold

    if (topic is None) == (from_topic is None):
        raise SpecError("`microbatch new` needs exactly one of --topic and --from-topic.",
                        fix="Give --topic TOPIC (with --format and --columns) to describe the records yourself, or "
                        "--from-topic TOPIC to infer them from the topic's records.")
    if from_topic is not None:
        if fmt is not None or columns is not None:
            raise SpecError("--from-topic infers the format and the columns, so --format and --columns do not go "
                            "with it.", fix="Drop them, or use --topic TOPIC --format ... --columns ... instead.")
        _new_from_topic(name, from_topic)
        return
    assert topic is not None
    parsed = scaffold.parse_columns(columns) if columns else None
    written = scaffold.new_pipeline(name, topic, fmt or "json", parsed)
    for path in written.values():
        console.print(f"wrote {path.relative_to(scaffold.ROOT)}", highlight=False)
    console.print(f"next: `microbatch migrate`, produce to {topic}, then `microbatch run {name}`.", highlight=False)


def _new_from_topic(name: str, topic: str) -> None:
    """`new NAME --from-topic TOPIC`: sample the topic, infer, write, and say what was inferred."""
    from microbatch import scaffold
    from microbatch.kafka.sampling import sample_topic

    scaffold.check_new_name(name, scaffold.ROOT)  # a bad or taken name is refused before Kafka is asked
    records = sample_topic(_kafka(), topic)
    written, inference = scaffold.new_pipeline_from_sample(
        name, topic, [r.key for r in records], [r.value for r in records], root=scaffold.ROOT,
        avro_schema=_latest_avro_schema)
    for line in inference.summary(topic):
        console.print(line, highlight=False, markup=False)
    for path in written.values():
        console.print(f"wrote {path.relative_to(scaffold.ROOT)}", highlight=False)
    console.print(f"next: check the fields and types in {written['spec'].relative_to(scaffold.ROOT)}, then "
                  f"`microbatch migrate` and `microbatch run {name}`.", highlight=False)


def _latest_avro_schema(subject: str) -> str | None:
    """The latest schema of `subject` in the configured schema registry; None when none is configured or it has no
    such subject (then `new --from-topic` keeps the bytes and says how to read them as avro)."""
    from microbatch.errors import MicrobatchError
    from microbatch.formats.schema_registry import Registry

    try:
        return Registry(settings.schema_registry_url()).version(subject, "latest").schema
    except MicrobatchError:
        return None


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
    from microbatch.runner import run_until_caught_up

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


@app.command()
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


@app.command()
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


if __name__ == "__main__":
    main()
