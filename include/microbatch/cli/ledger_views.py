"""The ledger's views in `microbatch`: each partition's lag (`status`), the recent batches (`history`), the sinks'
rows (`show`), the pipeline's state (`state`) and the metrics endpoint (`metrics`)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from microbatch.cli.common import JsonFlag, _kafka, _ledger_url, _pipeline_id, _print_rows, console
from microbatch.errors import MicrobatchError, SpecError

if TYPE_CHECKING:
    from microbatch.sinks.base import Sink


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


def show(
    pipeline: str,
    sink: Annotated[str | None, typer.Argument(help="One sink of the pipeline; every sink when omitted.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Rows to print per sink.")] = 15,
    count_by: Annotated[str | None, typer.Option(
        help="A lakehouse sink's table: rows per value of this column instead.")] = None,
) -> None:
    """The pipeline's sinks, in spec order, or SINK only: a table's first rows (the largest sums of an aggregate,
    the newest rows of a row sink or a lakehouse table), its row count and totals, and the pipeline's dead letters
    and late records; a Kafka sink's newest published records and how many of those its commits wrote were
    published."""
    from microbatch.config import find_spec
    from microbatch.sinks.capabilities import LakeTable, Publisher
    from microbatch.sinks.registry import sinks_of

    spec = find_spec(pipeline)
    shown = [s for s in sinks_of(spec).values() if s.table is not None or isinstance(s, LakeTable | Publisher)]
    chosen = [s for s in shown if s.name == sink] if sink else shown
    if not chosen:
        raise SpecError(f"Pipeline '{pipeline}' has no sink '{sink}'.",
                        fix=f"Use one of: {', '.join(s.name for s in shown) or 'none'}.")
    for one in chosen:
        if one.view_order is not None:
            _show_table(pipeline, one, limit)
        elif isinstance(one, LakeTable):
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
    from microbatch.sinks.capabilities import Publisher

    assert isinstance(sink, Publisher), "a sink shown by what it published is a Publisher"
    with transaction(_ledger_url()) as session:
        view = queries.published_view(session, _pipeline_id(session, pipeline), sink.name, limit)
    pending = view.written - view.published
    _print_rows(f"{sink.name} ({sink.type}, topic {sink.published_topic}): {view.published} records published in "
                f"{view.transactions} transaction(s), {pending} waiting in the outbox; newest published",
                view.columns, view.rows)


def _show_lake(sink: Sink, limit: int, count_by: str | None) -> None:
    from microbatch.sinks.capabilities import LakeTable

    assert isinstance(sink, LakeTable), "a sink shown by its lakehouse table is a LakeTable"
    view = sink.lake_view(limit, count_by)
    query = f"rows per {count_by}" if count_by else "newest rows"
    _print_rows(f"{sink.name} ({sink.type}, read by {view.reader}): {view.total_rows} rows in version "
                f"{view.version} of {view.location}, {view.files} files; {query}", view.columns, view.rows)


def find(
    pipeline: str,
    topic: str,
    partition: Annotated[int, typer.Argument(min=0)],
    offset: Annotated[int, typer.Argument(min=0)],
    as_json: JsonFlag = False,
) -> None:
    """Which batch and Airflow run processed TOPIC[PARTITION] OFFSET, or which gap recorded it as lost."""
    from microbatch.ledger.database import transaction
    from microbatch.phases.find import find_offset, finding_lines

    with transaction(_ledger_url()) as session:
        found = find_offset(session, pipeline, _pipeline_id(session, pipeline), topic, partition, offset)
    if as_json:
        print(json.dumps(found.as_dict()))
    else:
        for line in finding_lines(pipeline, found):
            console.print(line)
    if found.owner.kind == "none":
        raise typer.Exit(1)


def verify(pipeline: str, as_json: JsonFlag = False) -> None:
    """Audit the ledger: committed ranges and gaps cover every offset up to each position, no overlap; each
    lakehouse table holds every committed batch in exactly one version, and no other batch; and every sink holds
    the rows the ledger committed for each batch (`microbatch reland` lands a batch that lost them again)."""
    from microbatch.config import find_spec
    from microbatch.ledger.database import transaction
    from microbatch.phases.verify import verify_pipeline

    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
        try:
            spec = find_spec(pipeline)
        except SpecError:  # the ledger outlives a removed spec; its offsets are still audited
            spec = None
        found = verify_pipeline(session, pipeline, pid, spec)
    if as_json:
        print(json.dumps({"ok": found.ok, "ranges": found.ranges, "gaps": found.gaps, "tables": found.tables,
                          "problems": found.problems}))
    elif found.problems:
        for problem in found.problems:
            console.print(f"[red]violation[/red] {problem}")
    else:
        console.print(f"ok: {found.ranges} committed ranges and {found.gaps} gaps cover {found.partitions} "
                      "partitions with no hole and no overlap")
        for line in found.tables:
            console.print(f"ok: {line}")
    if found.problems:
        raise typer.Exit(1)
