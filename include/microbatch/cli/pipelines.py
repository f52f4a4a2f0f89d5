"""The pipeline commands of `microbatch`: write one (`new`), its data (`generate`), its tables and topics
(`migrate`), its DAG runs (`run`, `backfill`, `maintain`), its outbox (`publish`) and the spec's JSON Schema."""

from __future__ import annotations

import json
import logging
import sys
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from microbatch import settings
from microbatch.cli.common import (
    LogFile,
    _bootstrap,
    _kafka,
    _ledger,
    _ledger_url,
    _partitions_param,
    _quiet_clients,
    console,
)
from microbatch.cli.dag_runs import _dag_runs, _log_for
from microbatch.errors import SpecError


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


def run(
    pipeline: str,
    max_runs: Annotated[int, typer.Option(min=1, help="Stop after this many DAG runs.")] = 20,
    log_file: LogFile = None,
) -> None:
    """Run the pipeline's DAG locally (dag.test) until it has caught up with Kafka. Prints where its log goes, one
    line per DAG run (each task's state and seconds) and, when a run fails, the failed task's one-sentence cause and
    where the full log is (exit code 1). Airflow's and the tasks' log lines, tracebacks included, are in that file
    only."""
    from microbatch.airflow.runner import run_until_caught_up
    from microbatch.config import find_spec

    find_spec(pipeline)  # an unknown or bad spec is one sentence, before Airflow starts
    path = _log_for(pipeline, log_file, f"running the {pipeline} DAG until it has caught up")
    with _dag_runs(path) as report:
        outcomes = run_until_caught_up(pipeline, max_runs, on_outcome=report)
    _quiet_clients()
    if outcomes and outcomes[-1].state != "success":
        raise typer.Exit(1)


def maintain(pipeline: str, log_file: LogFile = None) -> None:
    """Run the pipeline's maintenance DAG now: each lakehouse sink maintains its table (a Delta table compacts its
    small files, then vacuums the files no retained version needs), the same as triggering
    <pipeline>__maintenance in the UI. Prints as `run` does."""
    from microbatch.airflow.runner import run_once
    from microbatch.config import find_spec

    find_spec(pipeline)
    path = _log_for(f"{pipeline}__maintenance", log_file, f"running the {pipeline}__maintenance DAG")
    with _dag_runs(path) as report:
        outcome = run_once(pipeline, maintenance=True)
        report(outcome)
    _quiet_clients()
    if outcome.state != "success":
        raise typer.Exit(1)


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
    from microbatch.airflow.runner import run_once
    from microbatch.config import find_spec
    from microbatch.phases.backfill import form_params, parse_params, plan_backfill
    from microbatch.phases.reporting import log_backfill_plan

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


def schema() -> None:
    """Print the JSON Schema of a pipeline spec, from its pydantic models (for editors that check specs)."""
    from microbatch.config import PipelineSpec

    print(json.dumps(PipelineSpec.model_json_schema(), indent=2))


def new(
    name: str,
    topic: Annotated[str | None, typer.Option(help="The Kafka topic the pipeline reads (with --format and "
                                                   "--columns).")] = None,
    from_topic: Annotated[str | None, typer.Option(
        "--from-topic", help="Sample up to 100 records of this live topic and infer a YAML-only pipeline from them: "
        "the key's and value's formats (json with typed fields, avro through a schema registry, text or raw) and one "
        "postgres_append sink with a sql query; for Debezium change events, the debezium format and one "
        "postgres_upsert sink keyed by the primary key that applies them; no transform.")] = None,
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
