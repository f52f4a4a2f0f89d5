"""The operators' changes to the record in `microbatch`: close an open batch (`abandon`), move positions or the
watermark (`reset`) and land committed batches again into a sink that lost their rows (`reland`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from microbatch import settings
from microbatch.cli.common import _fail, _kafka, _ledger, _ledger_url, _pipeline_id, console
from microbatch.errors import MicrobatchError, SpecError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from microbatch.config import PipelineSpec


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
    from microbatch.runtime import spark_jars
    from microbatch.sinks.registry import spark_session_conf
    from microbatch.spark_session import UTC_DRIVER, UTC_SESSION, build_session, connect_client_scope, connect_session

    mode = spec.spark.resolved(settings.spark_remote_set())
    if mode.mode == "connect":
        with connect_client_scope():
            spark = connect_session(settings.spark_remote(mode.connection), spec.spark.conf)
            try:
                yield spark
            finally:
                spark.stop()
        return
    spark = build_session(f"microbatch-{spec.name}-reland", master="local[2]",
                          conf={**UTC_SESSION, **UTC_DRIVER, "spark.ui.enabled": "false",
                                "spark.jars": ",".join(str(p) for p in spark_jars()),
                                **spark_session_conf(spec), **spec.spark.conf})
    try:
        yield spark
    finally:
        spark.stop()
