"""`postgres_aggregate`: a Postgres table whose sum columns add up on conflict of its key columns.

The stage writes the job's partial aggregates per source partition to `stage_<table>`. The commit merges
them with one `INSERT ... SELECT ... ON CONFLICT DO UPDATE` that adds the sums, and keeps them per
(batch, topic, partition) in `<table>_contributions`. A replay subtracts the contributions of the ranges
it supersedes before adding its own, then removes the rows that only those contributions held. With
`contributions: per_batch` the staged rows and the contributions are per key and batch instead, without the
source columns, and a replay recomputes whole batches (`planning.plan_replay`). A windowed
aggregate is published (by a kafka sink) one row per key of each window that became final, and again as a
correction when a backfill or a replay changes a final window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.config import PostgresAggregateSink
from microbatch.errors import SpecError
from microbatch.ledger import repository as repo
from microbatch.ledger.fragments import staged_rows, superseded_ranges
from microbatch.sinks.audit import count_kept
from microbatch.sinks.base import CommitContext, Sink, quote, sql_type, staging_columns, watermark_timestamp
from microbatch.sinks.contexts import PublishedRows, Staging
from microbatch.types import OffsetRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SOURCE_COLUMNS = ("topic", "partition")


def source_columns(sink: PostgresAggregateSink) -> tuple[str, ...]:
    """The source columns that the staged rows and the contributions carry: none when they are per batch."""
    return SOURCE_COLUMNS if sink.per_partition else ()


def merge_aggregate_sql(sink: PostgresAggregateSink) -> str:
    """Set-based merge of one batch's staged partial aggregates into the sink table."""
    keys = ", ".join(quote(k) for k in sink.keys)
    sums = ", ".join(f"sum({quote(c)})" for c in sink.sum_columns)
    updates = ", ".join(
        f"{quote(c)} = {quote(sink.table)}.{quote(c)} + EXCLUDED.{quote(c)}" for c in sink.sum_columns
    )
    return (
        f"INSERT INTO {quote(sink.table)} ({keys}, {', '.join(quote(c) for c in sink.sum_columns)}) "
        f"SELECT {keys}, {sums} FROM {staged_rows(quote(sink.staging_table))} GROUP BY {keys} "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates}"
    )


def contributions_sql(sink: PostgresAggregateSink) -> str:
    """Keep this batch's staged partial aggregates, per source partition or per key (what a replay retracts),
    copied as staged: every reader of the contributions sums them per key, so they need no grouping (whose sort
    was half of this statement at 80,000 rows: bench/commit_cost.py --explain)."""
    columns = ", ".join(quote(c) for c in (*source_columns(sink), *sink.key_and_sum_columns))
    return (
        f"INSERT INTO {quote(sink.contributions_table)} (batch_id, {columns}) "
        f"SELECT :batch_id, {columns} FROM {staged_rows(quote(sink.staging_table))}"
    )


def _replaced_sums(sink: PostgresAggregateSink) -> str:
    """The summed contributions of the ranges that the replay batch :batch_id superseded (per batch: of the
    batches whose ranges it superseded, all of them, as the replay's plan makes sure)."""
    keys = ", ".join(f"c.{quote(k)}" for k in sink.keys)
    sums = ", ".join(f"sum(c.{quote(c)}) AS {quote(c)}" for c in sink.sum_columns)
    if not sink.per_partition:
        return (
            f"SELECT {keys}, {sums} FROM {quote(sink.contributions_table)} c "
            f"JOIN (SELECT DISTINCT batch_id FROM {superseded_ranges()}) g "
            f"ON g.batch_id = c.batch_id GROUP BY {keys}"
        )
    return (
        f"SELECT {keys}, {sums} FROM {quote(sink.contributions_table)} c JOIN "
        f"{superseded_ranges('g', 'g.batch_id = c.batch_id AND g.topic = c.topic AND g.partition = c.partition')} "
        f"GROUP BY {keys}"
    )


def retract_sql(sink: PostgresAggregateSink) -> str:
    """Subtract the superseded contributions from the sink table."""
    updates = ", ".join(f"{quote(c)} = s.{quote(c)} - r.{quote(c)}" for c in sink.sum_columns)
    match = " AND ".join(f"s.{quote(k)} = r.{quote(k)}" for k in sink.keys)
    return f"UPDATE {quote(sink.table)} AS s SET {updates} FROM ({_replaced_sums(sink)}) AS r WHERE {match}"


def drop_emptied_sql(sink: PostgresAggregateSink) -> str:
    """Rows that only the superseded contributions held, now all zero, are removed."""
    match = " AND ".join(f"s.{quote(k)} = r.{quote(k)}" for k in sink.keys)
    zero = " AND ".join(f"s.{quote(c)} = 0" for c in sink.sum_columns)
    return f"DELETE FROM {quote(sink.table)} AS s USING ({_replaced_sums(sink)}) AS r WHERE {match} AND {zero}"


def final_windows_sql(sink: PostgresAggregateSink) -> str:
    """The rows of the windows that became final between the watermarks :low (exclusive) and :high."""
    assert sink.window is not None
    window_end = quote(sink.window.end)
    columns = ", ".join(quote(c) for c in sink.key_and_sum_columns)
    return (
        f"(SELECT {columns} FROM {quote(sink.table)} "
        f"WHERE {window_end} > coalesce(:low, '-infinity'::timestamptz) AND {window_end} <= :high) AS final"
    )


def changed_final_windows_sql(sink: PostgresAggregateSink) -> str:
    """The rows of the final windows (ending at or before :high) that a backfill batch's staged rows touch."""
    assert sink.window is not None
    keys = ", ".join(quote(k) for k in sink.keys)
    columns = ", ".join(f"s.{quote(c)}" for c in sink.key_and_sum_columns)
    return (
        f"(SELECT {columns} FROM {quote(sink.table)} s "
        f"WHERE ({', '.join(f's.{quote(k)}' for k in sink.keys)}) IN "
        f"(SELECT {keys} FROM {staged_rows(quote(sink.staging_table))}) "
        f"AND s.{quote(sink.window.end)} <= :high) AS final"
    )


def replay_footprint_sql(sink: PostgresAggregateSink) -> str:
    """(rows, first window start, last window end) of the contributions of the committed ranges in the JSON
    parameter :keys ({b: batch, t: topic, n: partition}); per batch, of whole batches (the plan replays those)."""
    window = sink.window
    span = (f', min("{window.start}"), max("{window.end}")' if window else ", NULL, NULL")
    if sink.per_partition:
        join = ("JOIN jsonb_to_recordset(CAST(:keys AS jsonb)) AS k(b bigint, t text, n int) "
                "ON c.batch_id = k.b AND c.topic = k.t AND c.partition = k.n")
    else:  # the plan replays whole batches
        join = ("JOIN (SELECT DISTINCT b FROM jsonb_to_recordset(CAST(:keys AS jsonb)) AS k(b bigint)) k "
                "ON c.batch_id = k.b")
    return f'SELECT count(*){span} FROM "{sink.contributions_table}" c {join}'


def replay_changes_sql(sink: PostgresAggregateSink) -> str:
    """Common table expressions ending in `final`: the final windows whose value the replay changed (a key
    the replay emptied has zero)."""
    assert sink.window is not None
    keys = ", ".join(quote(k) for k in sink.keys)
    sums = ", ".join(f"sum({quote(c)}) AS {quote(c)}" for c in sink.sum_columns)
    differs = " OR ".join(
        f"coalesce(new.{quote(c)}, 0) <> coalesce(old.{quote(c)}, 0)" for c in sink.sum_columns)
    values = ", ".join(f"coalesce(s.{quote(c)}, 0) AS {quote(c)}" for c in sink.sum_columns)
    return (
        f"WITH new AS (SELECT {keys}, {sums} FROM {staged_rows(quote(sink.staging_table))} GROUP BY {keys}), "
        f"old AS ({_replaced_sums(sink)}), "
        f"changed AS (SELECT {keys} FROM new FULL JOIN old USING ({keys}) WHERE {differs}), "
        f"final AS (SELECT {keys}, {values} FROM changed LEFT JOIN {quote(sink.table)} s USING ({keys}) "
        f"WHERE {quote(sink.window.end)} <= :high) "
    )


CORRECTIONS = "correction(s) of published windows"
"""What a backfill's or a replay's outbox rows of an aggregate are: final windows it changed, published again."""


class PostgresAggregate(Sink):
    type = "postgres_aggregate"
    row_audit = "kept"
    spec: PostgresAggregateSink

    def __init__(self, spec: PostgresAggregateSink) -> None:
        super().__init__(spec)
        self.staging = Staging(
            table=spec.staging_table,
            columns=(*source_columns(spec), *spec.key_and_sum_columns),
            fix="Return the sink's columns plus the source topic and partition (group by them as well)."
            if spec.per_partition else "Return the sink's key and sum columns.",
        )

    @property
    def table(self) -> str:
        return self.spec.table

    def kept_rows(self, session: Session, ctx: CommitContext) -> int:
        """The contributions the batch keeps (its partial sums per key, per partition or per batch)."""
        return count_kept(session, quote(self.spec.contributions_table), [ctx.batch_id])[ctx.batch_id]

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        return count_kept(session, quote(self.spec.contributions_table), list(ranges))

    @property
    def replays_whole_batches(self) -> bool:
        """Per batch (`contributions: per_batch`), a replay recomputes every partition of each batch it touches."""
        return not self.spec.per_partition

    @property
    def view_order(self) -> tuple[list[str], list[str]]:
        """The largest sums first."""
        return [f"{self.spec.sum_columns[0]} DESC", *self.spec.keys], list(self.spec.sum_columns)

    def replay_footprint(self, session: Session, keys: str) -> tuple[int, object, object]:
        rows, low, high = session.execute(text(replay_footprint_sql(self.spec)), {"keys": keys}).one()
        return rows, low, high

    def tables(self, metadata: sa.MetaData) -> list[sa.Table]:
        """With `columns`: the sink table (its keys the primary key, an index on a window's end for finality),
        `stage_<table>` and `<table>_contributions` (per source partition or per batch). Every key and sum column is NOT
        NULL. Without `columns`: none, the tables must exist."""
        spec = self.spec
        if spec.columns is None:
            return []
        columns = spec.columns

        def typed(*names: str) -> list[sa.Column]:
            return [sa.Column(name, sql_type(columns[name]), nullable=False) for name in names]

        def source() -> list[sa.Column]:
            types = {"topic": sa.Text, "partition": sa.Integer}
            return [sa.Column(name, types[name], nullable=False) for name in source_columns(spec)]

        table = sa.Table(spec.table, metadata, *typed(*spec.key_and_sum_columns),
                         sa.PrimaryKeyConstraint(*spec.keys, name=f"pk_{spec.table}"))
        if spec.window is not None:  # finality and publishing select by the window's end
            sa.Index(f"ix_{spec.table}_{spec.window.end}", table.c[spec.window.end])
        staging = sa.Table(spec.staging_table, metadata, *staging_columns(), *typed(*spec.key_and_sum_columns),
                           *source())
        sa.Index(f"ix_{spec.staging_table}_batch", staging.c.batch_id, staging.c.attempt)
        # An append-only log of what each commit added, read only by a replay or a backfill, for a few batches.
        # No foreign key to batches: its check ran once per inserted row and took most of a commit (80,000 rows:
        # bench/commit_cost.py --explain). No primary key either: it cost 0.14 s of that commit more than an
        # index on batch_id alone, and nothing needs it, since every reader sums or counts per key (migration
        # 0010). Not BRIN, though cheaper still: the ranges appended since the last vacuum stay unsummarized, so
        # a replay of a recent batch would read them all.
        contributions = sa.Table(
            spec.contributions_table, metadata,
            sa.Column("batch_id", sa.BigInteger, nullable=False),
            *source(), *typed(*spec.key_and_sum_columns),
        )
        sa.Index(f"ix_{spec.contributions_table}", contributions.c.batch_id)  # as long as the old key's name
        return [table, staging, contributions]

    def staged_rows(self, rows: DataFrame) -> DataFrame:
        """Per batch: the job's rows summed per key when they still carry the source columns (one more small
        shuffle; a job that groups by the keys alone saves it)."""
        present = [c for c in SOURCE_COLUMNS if c in rows.columns]
        if self.spec.per_partition or not present:
            return rows
        from pyspark.sql import functions as F

        types = {f.name: f.dataType for f in rows.schema.fields}
        return rows.groupBy(*self.spec.keys).agg(
            *[F.sum(c).cast(types[c]).alias(c) for c in self.spec.sum_columns])

    def retract(self, session: Session, ctx: CommitContext) -> int:
        if not self.spec.per_partition:
            self._check_whole_batches(session, ctx)
        return session.execute(text(retract_sql(self.spec)), {"batch_id": ctx.batch_id}).rowcount

    def _check_whole_batches(self, session: Session, ctx: CommitContext) -> None:
        """Per batch, a replay must supersede every range of each batch it touches, or the retraction would take
        back more than it recomputes (a replay planned before the sink's `contributions` became `per_batch`)."""
        partial = repo.partly_superseded_batch(session, ctx.batch_id)
        if partial is not None:
            raise SpecError(
                f"Replay batch {ctx.batch_id} recomputes only part of batch {partial}, but sink '{self.name}' keeps "
                "one contribution per batch (contributions: per_batch); nothing was written.",
                fix=f"Abandon batch {ctx.batch_id} (`microbatch abandon`) and plan the replay again: it then "
                "covers whole batches.")

    def merge(self, session: Session, ctx: CommitContext) -> int:
        merged = session.execute(text(merge_aggregate_sql(self.spec)), ctx.staged).rowcount
        session.execute(text(contributions_sql(self.spec)), ctx.staged)
        if ctx.replay:
            session.execute(text(drop_emptied_sql(self.spec)), {"batch_id": ctx.batch_id})
        return merged

    def published_rows(self, ctx: CommitContext) -> PublishedRows | None:
        """Scheduled batch: every key of the windows that the watermark's advance made final. Backfill or
        replay: the final windows it changed, as corrections, while the watermark stands where it is."""
        keys = ", ".join(quote(k) for k in self.spec.keys)
        high = watermark_timestamp(ctx.watermark_after)
        if ctx.backfill:
            if ctx.watermark_after is None:
                return None
            params = {**ctx.staged, "high": high}
            if ctx.replay:
                return PublishedRows("final", keys, params, correction=True, ctes=replay_changes_sql(self.spec),
                                     label=CORRECTIONS)
            return PublishedRows(changed_final_windows_sql(self.spec), keys, params, correction=True,
                                 label=CORRECTIONS)
        if ctx.watermark_after is None or ctx.watermark_after == ctx.watermark_before:
            return None
        return PublishedRows(final_windows_sql(self.spec), keys,
                             {"low": watermark_timestamp(ctx.watermark_before), "high": high},
                             label="row(s) of the window(s) that became final")
