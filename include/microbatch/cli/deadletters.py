"""The dead-letter commands of `microbatch`: list the chosen dead letters (`dead-letters`) and, after a fix,
re-process them (`reprocess`: replay the committed ranges that hold them with the backfill DAG)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from microbatch.cli.common import (
    JsonFlag,
    LogFile,
    _kafka,
    _ledger,
    _ledger_url,
    _pipeline_id,
    _print_rows,
    _quiet_clients,
    console,
)
from microbatch.cli.dag_runs import _dag_runs, _log_for

BatchFilter = Annotated[int | None, typer.Option("--batch", help="Only the dead letters of this batch.")]
TopicFilter = Annotated[str | None, typer.Option(help="Only this topic.")]
PartitionFilter = Annotated[int | None, typer.Option(min=0, help="Only this partition.")]
SinceFilter = Annotated[str | None, typer.Option(help="Records at or after this ISO-8601 time (Kafka timestamp).")]
UntilFilter = Annotated[str | None, typer.Option(help="Records before this ISO-8601 time (Kafka timestamp).")]
ReasonFilter = Annotated[str | None, typer.Option(help="Only reasons that contain this text (any case).")]


def _dead_letters(pipeline: str, batch: int | None, topic: str | None, partition: int | None, since: str | None,
                  until: str | None, reason: str | None, limit: int | None) -> list:
    from microbatch.ledger.database import transaction
    from microbatch.phases.reprocess import LetterFilter, matching_dead_letters

    chosen = LetterFilter.parse(batch, topic, partition, since, until, reason)
    with transaction(_ledger_url()) as session:
        pid = _pipeline_id(session, pipeline)
        return matching_dead_letters(session, pid, chosen, limit)


def _preview(data: bytes | None, width: int = 40) -> str:
    """The start of a key or value as text (bytes that are not UTF-8 shown escaped), for a table cell."""
    if data is None:
        return "null"
    shown = data.decode("utf-8", errors="backslashreplace")
    return shown if len(shown) <= width else shown[: width - 1] + "…"


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


def reprocess(
    pipeline: str, batch: BatchFilter = None, topic: TopicFilter = None, partition: PartitionFilter = None,
    since: SinceFilter = None, until: UntilFilter = None, reason: ReasonFilter = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ranges and counts; write nothing.")] = False,
    log_file: LogFile = None,
) -> None:
    """Re-process the chosen dead letters after a fix: replay exactly the committed ranges that hold them (one replay
    per range, from its batch's state, as `backfill --mode replay`). Every sink must take replays; a record that is
    valid now but whose window was already final when its batch began becomes a late record."""
    from microbatch.airflow.runner import run_once
    from microbatch.config import find_spec
    from microbatch.phases.reprocess import plan_reprocess

    letters = _dead_letters(pipeline, batch, topic, partition, since, until, reason, None)
    if not letters:
        console.print(f"{pipeline}: no dead letter matches; nothing to re-process")
        return
    plan = plan_reprocess(find_spec(pipeline), letters, _ledger(), _kafka())
    _print_rows(f"{pipeline}: {len(letters)} dead letter(s) in {len(plan.ranges)} committed range(s) to replay",
                ["topic", "partition", "range", "batch", "dead letters"], plan.rows())
    if dry_run:
        return
    path = _log_for(f"{pipeline}__backfill", log_file, f"re-processing with the {pipeline}__backfill DAG")
    with _dag_runs(path) as report:
        for replay in plan.replays():
            outcome = run_once(pipeline, backfill=replay)
            report(outcome)
            if outcome.state != "success":
                break
    _quiet_clients()
    if outcome.state != "success":
        raise typer.Exit(1)
    left = _dead_letters(pipeline, batch, topic, partition, since, until, reason, None)
    console.print(f"{pipeline}: re-processed {len(plan.ranges)} range(s); {len(letters) - len(left)} of "
                  f"{len(letters)} dead letter(s) are now rows or late records, {len(left)} remain (`microbatch "
                  f"dead-letters {pipeline}` lists them)")
