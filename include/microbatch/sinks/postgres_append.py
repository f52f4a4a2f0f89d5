"""`postgres_append`: every output row inserted once, with the source coordinates of the record it came from.

The stage writes the job's rows for the sink, each with its record's `topic`, `partition` and `offset`, to
`stage_<table>`. The commit inserts them into `<table>`, whose primary key is (topic, partition, offset): a
second insert of one record is impossible, so a bug that would duplicate a row fails the commit instead. A
replay first deletes the rows of the ranges it supersedes (each superseded range's partition and offsets),
then inserts its own, in the commit's one transaction. With `include_late` (the default) the stage hands
the job's `outputs` the late records too for this sink (see `phases/stage.py`), so a raw landing table takes
every valid record, while an aggregate sink of the same pipeline still sends them to `late_records`.

A kafka sink may publish the rows: each row of a scheduled or backfill batch once, in source order; of a replay,
only the rows whose content changed (corrections) and those it no longer gives (retractions): a consumer that keeps
the last value per coordinates, and drops a retracted one, ends equal to the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from microbatch.config import SOURCE_COORDINATES, KafkaSink, PostgresAppendSink
from microbatch.errors import MicrobatchError
from microbatch.ledger.fragments import staged_rows, superseded_ranges
from microbatch.sinks.audit import count_rows, delete_rows_sql, ranges_params
from microbatch.sinks.base import CommitContext, Sink, quote, sql_type, staging_columns
from microbatch.sinks.contexts import PublishedRows, RelandContext, Staging
from microbatch.types import OffsetRange


def coordinate_columns() -> list[sa.Column]:
    """The source coordinates every row sink's rows carry, as the ledger types them."""
    return [sa.Column("topic", sa.Text, nullable=False), sa.Column("partition", sa.Integer, nullable=False),
            sa.Column("offset", sa.BigInteger, nullable=False)]


def row_columns(sink: PostgresAppendSink) -> tuple[str, ...]:
    """The columns of a row: the spec's, then the source coordinates."""
    return (*sink.columns, *SOURCE_COORDINATES)


def insert_rows_sql(sink: PostgresAppendSink) -> str:
    """Insert one batch's staged rows into the sink table (a duplicate coordinate violates the primary key)."""
    columns = ", ".join(quote(c) for c in row_columns(sink))
    return (
        f"INSERT INTO {quote(sink.table)} ({columns}) SELECT {columns} FROM {staged_rows(quote(sink.staging_table))}"
    )


def delete_replaced_sql(sink: PostgresAppendSink) -> str:
    """Delete the rows of every committed range that the replay batch :batch_id superseded."""
    return (
        f"DELETE FROM {quote(sink.table)} AS s USING {superseded_ranges('g')} "
        'AND s.topic = g.topic AND s."partition" = g.partition '
        'AND s."offset" >= g.start_offset AND s."offset" < g.end_offset'
    )


def staged_rows_sql(sink: PostgresAppendSink | KafkaSink) -> str:
    """This batch's staged rows (the sink's columns and the source coordinates), as a SELECT."""
    columns = ", ".join(quote(c) for c in (*(sink.columns or {}), *SOURCE_COORDINATES))
    return f"SELECT {columns} FROM {staged_rows(quote(sink.staging_table))}"


def published_staged_rows(sink: PostgresAppendSink | KafkaSink, ctx: CommitContext) -> PublishedRows:
    """The rows a kafka sink publishes of a row sink's batch (an append sink's, or its own): each staged row once,
    in source order; a replay's only where they changed (corrections) or disappeared (retractions)."""
    select = staged_rows_sql(sink)
    order = ", ".join(quote(c) for c in SOURCE_COORDINATES)
    if ctx.replay:
        return PublishedRows("", order, dict(ctx.staged), correction=True, coordinates=True, replay_rows=select,
                             label="correction(s) and retraction(s) of published rows")
    return PublishedRows(f"({select}) AS final", order, dict(ctx.staged), coordinates=True)


class PostgresAppend(Sink):
    type = "postgres_append"
    row_audit = "coordinates"
    spec: PostgresAppendSink

    def __init__(self, spec: PostgresAppendSink) -> None:
        super().__init__(spec)
        self.staging = Staging(
            table=spec.staging_table,
            columns=row_columns(spec),
            fix="Return the sink's columns plus the source topic, partition and offset of each record's row.",
        )

    @property
    def table(self) -> str:
        return self.spec.table

    def clear_reland(self, session: Session, ctx: RelandContext) -> None:
        session.execute(text(f"DELETE FROM {staged_rows(quote(self.spec.staging_table))}"), ctx.staged)

    def reland_staged(self, session: Session, ctx: RelandContext) -> int:
        session.execute(text(delete_rows_sql(quote(self.spec.table))), ranges_params({ctx.batch_id: ctx.ranges}))
        landed = session.execute(text(insert_rows_sql(self.spec)), ctx.staged).rowcount
        self.clear_reland(session, ctx)
        return landed

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        return count_rows(session, quote(self.spec.table), ranges)

    @property
    def include_late(self) -> bool:
        return self.spec.include_late

    def tables(self, metadata: sa.MetaData) -> list[sa.Table]:
        spec = self.spec
        table = sa.Table(
            spec.table, metadata,
            *(sa.Column(name, sql_type(kind), nullable=True) for name, kind in spec.columns.items()),
            *coordinate_columns(),
            sa.PrimaryKeyConstraint(*SOURCE_COORDINATES, name=f"{spec.table}_pkey"),
        )
        staging = sa.Table(
            spec.staging_table, metadata,
            *staging_columns(),
            *(sa.Column(name, sql_type(kind), nullable=True) for name, kind in spec.columns.items()),
            *coordinate_columns(),
            sa.Index(f"ix_{spec.staging_table}_batch", "batch_id", "attempt"),
        )
        return [table, staging]

    def retract(self, session: Session, ctx: CommitContext) -> int:
        return session.execute(text(delete_replaced_sql(self.spec)), {"batch_id": ctx.batch_id}).rowcount

    def merge(self, session: Session, ctx: CommitContext) -> int:
        try:
            with session.begin_nested():
                return session.execute(text(insert_rows_sql(self.spec)), ctx.staged).rowcount
        except IntegrityError as exc:
            if getattr(exc.orig, "sqlstate", None) != "23505":  # not a unique violation
                raise
            raise MicrobatchError(
                f"Batch {ctx.batch_id}: sink {self.name} would hold a second row for one source record "
                f"(table {self.spec.table}, primary key topic, partition, offset).",
                fix="Return at most one row per record for an append sink; nothing was written.",
            ) from None

    def published_rows(self, ctx: CommitContext) -> PublishedRows | None:
        return published_staged_rows(self.spec, ctx)
