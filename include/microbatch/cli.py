"""The `microbatch` operator CLI (Typer + Rich)."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from microbatch import localenv
from microbatch.errors import MicrobatchError

app = typer.Typer(help="Exactly-once Kafka micro-batches: ledger, data and local stack.", no_args_is_help=True)
console = Console(soft_wrap=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _ledger_url() -> str:
    from microbatch.ledger.database import ledger_url_from_env

    return ledger_url_from_env()


def _fail(exc: MicrobatchError) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2)


@app.command()
def migrate() -> None:
    """Create or upgrade the ledger schema (Alembic upgrade head)."""
    from microbatch.ledger.database import migrate as run_migrate

    try:
        revision = run_migrate(_ledger_url())
    except MicrobatchError as exc:
        _fail(exc)
    console.print(f"ledger schema at revision {revision}")


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
    """Produce sample nginx access-log lines into a topic (created if missing)."""
    from microbatch.datagen import generate_lines, produce_lines
    from microbatch.devstack import create_topic
    from microbatch.kafka_offsets import bootstrap_from_env

    try:
        bootstrap = bootstrap_from_env()
    except MicrobatchError as exc:
        _fail(exc)
    create_topic(bootstrap, topic, partitions)
    lines = generate_lines(count, ips=ips, span_seconds=span_seconds, out_of_order=out_of_order,
                           malformed=malformed, seed=seed)
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
) -> None:
    """Run the pipeline's DAG locally (dag.test) until it has caught up with Kafka."""
    from microbatch.runner import run_until_caught_up

    try:
        outcomes = run_until_caught_up(pipeline, max_runs)
    except MicrobatchError as exc:
        _fail(exc)
    for outcome in outcomes:
        console.print(f"{outcome.run_id}: {outcome.state} {outcome.task_states}")
    if outcomes and outcomes[-1].state != "success":
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
) -> None:
    """Run the pipeline's backfill DAG (the same as triggering <pipeline>__backfill in the UI)."""
    from microbatch.backfill import parse_params
    from microbatch.config import find_spec
    from microbatch.runner import run_once

    params = {"topic": topic, "start": start, "end": end, "mode": mode, "dry_run": dry_run,
              "partitions": "all" if partitions == "all" else [int(p) for p in partitions.split(",")]}
    try:
        parse_params(find_spec(pipeline), params)  # refuse bad parameters before anything runs
        outcome = run_once(pipeline, backfill=params)
    except MicrobatchError as exc:
        _fail(exc)
    console.print(f"{outcome.run_id}: {outcome.state} {outcome.task_states}")
    if outcome.state != "success":
        raise typer.Exit(1)


@app.command()
def abandon(
    pipeline: str,
    batch: Annotated[int, typer.Argument(help="The open batch id (see `microbatch history`).")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Close an open (planned or staged) batch whose run is gone, so its ranges can be planned again."""
    from microbatch.ledger import queries
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction

    if not yes and not typer.confirm(f"Abandon batch {batch} of {pipeline}? Its staged work is discarded."):
        raise typer.Exit(1)
    with transaction(_ledger_url()) as session:
        pid = queries.pipeline_id(session, pipeline)
        if pid is None:
            _fail(MicrobatchError(f"The ledger has no pipeline '{pipeline}'.", fix="Check the name."))
        was = repo.abandon_open_batch(session, pid, batch, "abandoned by an operator (microbatch abandon)")
    if was is None:
        _fail(MicrobatchError(f"Batch {batch} of {pipeline} is not open (planned or staged); nothing changed.",
                              fix="See `microbatch history` for its state."))
    console.print(f"batch {batch} of {pipeline}: {was} -> abandoned; its ranges can be planned again")


@app.command()
def reset(
    pipeline: str,
    to: Annotated[str, typer.Option("--to", help="earliest, latest, offset or timestamp.")],
    value: Annotated[str | None, typer.Option(help="The offset, or the ISO-8601 time.")] = None,
    topic: Annotated[str | None, typer.Option(help="One topic; all of the pipeline's when omitted.")] = None,
    partition: Annotated[int | None, typer.Option(help="One partition; all when omitted.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Move positions once, on the record: refused while a batch is open; skipped offsets become a gap."""
    import getpass

    from kafka import TopicPartition as KafkaTopicPartition

    from microbatch.config import find_spec
    from microbatch.kafka_offsets import (
        bootstrap_from_env,
        discover_partitions,
        offset_bounds,
        offsets_client,
        source_partitions,
    )
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction
    from microbatch.reset import apply_moves, parse_time, plan_moves, resolve_target

    if to not in ("earliest", "latest", "offset", "timestamp"):
        _fail(MicrobatchError(f"reset: --to '{to}' is not a target.", fix="Use earliest, latest, offset or timestamp."))
    try:
        spec = find_spec(pipeline)
        with offsets_client(bootstrap_from_env(), spec.source.isolation_level) as consumer:
            partitions = [tp for tp in (discover_partitions(consumer, [topic]) if topic
                                        else source_partitions(consumer, spec.source))
                          if partition is None or tp.partition == partition]
            if not partitions:
                _fail(MicrobatchError(f"reset: partition {partition} does not exist.", fix="Check --partition."))
            earliest, latest = offset_bounds(consumer, partitions)
            for_time = None
            if to == "timestamp":
                millis = int(parse_time(value or "").timestamp() * 1000)
                found = consumer.offsets_for_times({KafkaTopicPartition(tp.topic, tp.partition): millis
                                                    for tp in partitions})
                for_time = {tp: (found[KafkaTopicPartition(tp.topic, tp.partition)] or None) and
                            found[KafkaTopicPartition(tp.topic, tp.partition)].offset for tp in partitions}
        new = resolve_target(to, value, earliest, latest, for_time)  # type: ignore[arg-type]
        with transaction(_ledger_url()) as session:
            pipeline_row = repo.ensure_pipeline(session, spec, lock=True)
            moves = plan_moves(session, pipeline_row.id, new)
            if not moves:
                console.print("nothing to change: every position is already there")
                return
            table = Table(title=f"{pipeline}: reset --to {to}")
            for column in ("partition", "from", "to", "skipped offsets"):
                table.add_column(column)
            for m in moves:
                table.add_row(str(m.tp), "-" if m.old is None else str(m.old), str(m.new), str(m.skipped))
            console.print(table)
            if not yes and not typer.confirm("Apply this reset?"):
                raise typer.Exit(1)
            apply_moves(session, pipeline_row.id, moves, to, getpass.getuser())
    except MicrobatchError as exc:
        _fail(exc)
    console.print(f"reset applied to {len(moves)} partition(s); skipped offsets are recorded as gaps")


@app.command()
def publish(pipeline: str) -> None:
    """Publish the pipeline's pending outbox rows to its Kafka sinks (what the publish task does)."""
    from microbatch.config import find_spec
    from microbatch.kafka_offsets import bootstrap_from_env
    from microbatch.publisher import publish_sink

    try:
        spec = find_spec(pipeline)
        for sink in spec.kafka_sinks:
            result = publish_sink(spec, sink, _ledger_url(), bootstrap_from_env())
            console.print(f"{sink.name}: sequences {result.first_seq}..{result.last_seq} published "
                          f"({result.records} records, {result.transactions} transactions) to {result.topic}")
    except MicrobatchError as exc:
        _fail(exc)


def _latest_offsets(name: str) -> dict:
    """Latest offsets of the pipeline's partitions, or {} with a warning when Kafka is unreachable."""
    from microbatch.config import find_spec
    from microbatch.kafka_offsets import bootstrap_from_env, offset_bounds, offsets_client, source_partitions

    try:
        spec = find_spec(name)
        with offsets_client(bootstrap_from_env(), spec.source.isolation_level) as consumer:
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
        report = {}
        for name in names:
            pid = queries.pipeline_id(session, name)
            if pid is None:
                _fail(MicrobatchError(f"The ledger has no pipeline '{name}'.", fix="Run it first."))
            report[name] = queries.partition_status(session, pid, _latest_offsets(name))
    if as_json:
        print(json.dumps({name: [queries.to_dict(r) for r in rows] for name, rows in report.items()}))
        return
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


@app.command()
def history(pipeline: str, limit: Annotated[int, typer.Option(min=1)] = 20, as_json: JsonFlag = False) -> None:
    """Recent batches: kind, state, ranges, counts, durations and the Airflow run id."""
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        pid = queries.pipeline_id(session, pipeline)
        if pid is None:
            _fail(MicrobatchError(f"The ledger has no pipeline '{pipeline}'.", fix="Run it first."))
        batches = queries.batch_history(session, pid, limit)
    if as_json:
        print(json.dumps([queries.to_dict(b) for b in batches]))
        return
    table = Table(title=f"{pipeline}: last {len(batches)} batches")
    for column in ("batch", "kind", "state", "try", "ranges", "records", "dead", "late", "seconds", "airflow run"):
        table.add_column(column)
    for b in batches:
        seconds = " ".join(f"{k.removesuffix('_s')}={v}" for k, v in b.durations.items())
        table.add_row(str(b.id), b.kind, b.state + (f" ({b.error})" if b.error and b.state != "committed" else ""),
                      str(b.attempt), b.ranges, str(b.records if b.records is not None else "-"),
                      str(b.dead_letters or 0), str(b.late_records or 0), seconds, b.airflow_run_id or "-")
    console.print(table)


@app.command()
def find(pipeline: str, topic: str, partition: int, offset: int, as_json: JsonFlag = False) -> None:
    """Which batch and Airflow run processed TOPIC[PARTITION] OFFSET, or which gap recorded it as lost."""
    from microbatch.ledger import queries
    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        pid = queries.pipeline_id(session, pipeline)
        if pid is None:
            _fail(MicrobatchError(f"The ledger has no pipeline '{pipeline}'.", fix="Run it first."))
        owner = queries.find_offset(session, pid, topic, partition, offset)
    if as_json:
        print(json.dumps(queries.to_dict(owner)))
    elif owner.kind == "batch":
        console.print(f"{topic}[{partition}] offset {offset} was processed by batch {owner.batch_id} "
                      f"(range [{owner.start}, {owner.end}), Airflow run {owner.airflow_run_id})")
    elif owner.kind == "gap":
        console.print(f"{topic}[{partition}] offset {offset} was lost: gap [{owner.start}, {owner.end}) "
                      f"recorded by {f'batch {owner.batch_id}' if owner.batch_id else 'an operator'}: {owner.reason}")
    else:
        console.print(f"{topic}[{partition}] offset {offset} has not been processed yet")
    if owner.kind == "none":
        raise typer.Exit(1)


@app.command()
def verify(pipeline: str, as_json: JsonFlag = False) -> None:
    """Audit the ledger: committed ranges and gaps cover every offset up to each position, no overlap."""
    from microbatch.ledger import repository as repo
    from microbatch.ledger.database import transaction
    from microbatch.planning import find_holes, find_overlaps

    try:
        with transaction(_ledger_url()) as session:
            record = repo.get_pipeline(session, pipeline)
            if record is None:
                _fail(MicrobatchError(f"The ledger has no pipeline '{pipeline}'.", fix="Run it first."))
            ranges = repo.committed_ranges(session, record.id)
            gaps = repo.committed_gaps(session, record.id)
            positions = repo.read_positions(session, record.id)
    except MicrobatchError as exc:
        _fail(exc)
    problems = [f"overlap: {a} and {b}" for a, b in find_overlaps(ranges)] + find_holes(ranges, gaps, positions)
    if as_json:
        print(json.dumps({"ok": not problems, "ranges": len(ranges), "gaps": len(gaps), "problems": problems}))
    elif problems:
        for problem in problems:
            console.print(f"[red]violation[/red] {problem}")
    else:
        console.print(f"ok: {len(ranges)} committed ranges and {len(gaps)} gaps cover {len(positions)} partitions "
                      "with no hole and no overlap")
    if problems:
        raise typer.Exit(1)


@app.command()
def counts(limit: Annotated[int, typer.Option(min=1)] = 15) -> None:
    """The ip_count sink: the busiest (window, ip) pairs and the totals."""
    from sqlalchemy import text

    from microbatch.ledger.database import transaction

    with transaction(_ledger_url()) as session:
        top = session.execute(text(
            "SELECT window_start, window_end, ip, count FROM ip_counts ORDER BY count DESC, window_start, ip LIMIT :n"
        ), {"n": limit}).all()
        windows, rows, total = session.execute(
            text("SELECT count(DISTINCT window_start), count(*), coalesce(sum(count), 0) FROM ip_counts")
        ).one()
        dead = session.execute(text("SELECT count(*) FROM dead_letters")).scalar_one()
    table = Table(title=f"ip_counts: {total} requests in {rows} rows over {windows} windows; {dead} dead letters")
    for column in ("window_start", "window_end", "ip", "count"):
        table.add_column(column)
    for row in top:
        table.add_row(f"{row[0]:%H:%M:%S}", f"{row[1]:%H:%M:%S}", row[2], str(row[3]))
    console.print(table)


def _create_output_topics(pipeline: str) -> None:
    from microbatch.config import find_spec
    from microbatch.devstack import create_topic
    from microbatch.kafka_offsets import bootstrap_from_env

    for sink in find_spec(pipeline).kafka_sinks:
        create_topic(bootstrap_from_env(), sink.topic, 4)


@app.command()
def demo(count: int = 10_000) -> None:
    """The whole path on the local stack: services, data, the ip_count DAG, the results."""
    from microbatch import devstack
    from microbatch.ledger.database import migrate as run_migrate

    localenv.apply()
    env = devstack.up()
    os.environ.update(env)
    run_migrate(env["MICROBATCH_LEDGER_URL"])
    _create_output_topics("ip_count")
    generate(count=count, topic="ip_count_source", partitions=4, ips=20, span_seconds=60, out_of_order=0.1,
             malformed=0.02, seed=int.from_bytes(os.urandom(2), "big"))
    run("ip_count", max_runs=20)
    counts()
    status("ip_count")
    history("ip_count", limit=10)
    console.print("The services keep running; stop them with `make down`.")


@app.command()
def airflow() -> None:
    """Start the local services and `airflow standalone` with this project's dags/ and plugins/."""
    from microbatch import devstack
    from microbatch.ledger.database import migrate as run_migrate

    localenv.apply()
    env = devstack.up()
    os.environ.update(env)
    run_migrate(env["MICROBATCH_LEDGER_URL"])
    devstack.create_topic(env["MICROBATCH_KAFKA_BOOTSTRAP"], "ip_count_source", 4)
    _create_output_topics("ip_count")
    console.print(f"Airflow UI on http://127.0.0.1:8080 (AIRFLOW_HOME={os.environ['AIRFLOW_HOME']})")
    airflow_bin = os.path.join(os.path.dirname(sys.executable), "airflow")
    os.execv(airflow_bin, [airflow_bin, "standalone"])


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    localenv.apply()
    app()


if __name__ == "__main__":
    main()
