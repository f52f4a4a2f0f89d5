"""`postgres_upsert`: the last value per key, tombstones included, exact under replay.

"Last" is a total order: the greatest (`order_by` if the spec gives one, nulls lowest; then topic, partition
and offset) among all committed, non-superseded records. A record whose `delete_column` is true, or whose
value columns (neither keys nor `order_by`) are all null, is a tombstone: if it wins, the key is absent.

The commit keeps, in `<table>_versions`, each key's greatest record of every (batch, topic, partition) it
committed (every record, for a change stream with `unavailable_value`), what the aggregate's contributions table
is to a sum, tombstones included, and rebuilds a key's
row from its versions whenever a batch touches the key. A replay deletes the versions of the ranges it
supersedes and rebuilds the keys they held before it adds its own, so the table ends exactly as if the
history had been processed once in order, also for keys whose winner came from a later batch.

With `unavailable_value` (a change data capture's placeholder of an unchanged column, Debezium's
`__debezium_unavailable_value`), a text column holding it takes the key's latest real value before it, since its
last delete (`_filled`): within the batch's records before its version is kept, and among the versions when a key
is rebuilt; before that, `fill_unchanged` replaces each staged placeholder by the value it stands for, following the
key (and a primary-key change) through the table and the batch in log order (`unchanged_values`). A key whose
winning version still holds it (its full value never seen since the delete) is held: absent until a version with
the full value arrives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.column_types import TEXT
from microbatch.config import SOURCE_COORDINATES, PostgresUpsertSink
from microbatch.errors import SpecError
from microbatch.ledger.fragments import staged_rows, superseded_ranges
from microbatch.sinks.audit import count_kept
from microbatch.sinks.base import CommitContext, Sink, quote, sql_type, staging_columns, tombstone_sql
from microbatch.sinks.contexts import Staging
from microbatch.sinks.postgres_append import coordinate_columns
from microbatch.sinks.unchanged_values import StagedChange, resolve
from microbatch.types import OffsetRange


def versions_table(sink: PostgresUpsertSink) -> str:
    """Every committed (batch, topic, partition)'s greatest record per key, kept so a replay can rebuild."""
    return f"{sink.table}_versions"


def _cols(names: list[str] | tuple[str, ...], alias: str = "") -> str:
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{quote(n)}" for n in names)


def _order(sink: PostgresUpsertSink, alias: str = "") -> str:
    """Greatest first: the order column (nulls lowest), then topic, partition and offset."""
    prefix = f"{alias}." if alias else ""
    first = [f"{prefix}{quote(sink.order_by)} DESC NULLS LAST"] if sink.order_by else []
    return ", ".join([*first, *(f"{prefix}{quote(c)} DESC" for c in SOURCE_COORDINATES)])


def stored_columns(sink: PostgresUpsertSink) -> tuple[str, ...]:
    return (*sink.columns, *SOURCE_COORDINATES)


def _ascending(sink: PostgresUpsertSink) -> str:
    """`_order` reversed: oldest first."""
    first = [f"{quote(sink.order_by)} ASC NULLS FIRST"] if sink.order_by else []
    return ", ".join([*first, *(quote(c) for c in SOURCE_COORDINATES)])


def fillable_columns(sink: PostgresUpsertSink) -> list[str]:
    """The text columns that may hold `unavailable_value` (neither keys nor the order column)."""
    if sink.unavailable_value is None:
        return []
    return [c for c, kind in sink.columns.items() if kind == TEXT and c not in sink.keys and c != sink.order_by]


def _literal(text_value: str) -> str:
    return "'" + text_value.replace("'", "''") + "'"


def _filled(sink: PostgresUpsertSink, relation: str, partition: list[str]) -> str:
    """`relation` (a FROM item with the stored columns and `deleted`) with each fillable column's placeholder replaced
    by the latest real value before it in its `partition`, since the partition's last delete; a placeholder with no
    such value stays (the row is then held)."""
    columns = fillable_columns(sink)
    if not columns:
        return relation
    held = _literal(sink.unavailable_value or "")
    by = _cols(partition)
    segment = (f"count(*) FILTER (WHERE deleted) OVER (PARTITION BY {by} ORDER BY {_ascending(sink)} "
               "ROWS UNBOUNDED PRECEDING) AS mb_segment")
    groups = ", ".join(
        f"count(*) FILTER (WHERE NOT deleted AND {quote(c)} IS DISTINCT FROM {held}) OVER (PARTITION BY {by}, "
        f"mb_segment ORDER BY {_ascending(sink)} ROWS UNBOUNDED PRECEDING) AS mb_group{i}"
        for i, c in enumerate(columns))
    values = [
        f"CASE WHEN {quote(c)} = {held} AND mb_group{columns.index(c)} > 0 THEN first_value({quote(c)}) OVER "
        f"(PARTITION BY {by}, mb_segment, mb_group{columns.index(c)} ORDER BY {_ascending(sink)}) ELSE {quote(c)} "
        f"END AS {quote(c)}" if c in columns else quote(c) for c in stored_columns(sink)]
    return (f"(SELECT {', '.join(values)}, deleted FROM (SELECT *, {groups} FROM (SELECT *, {segment} FROM "
            f"{relation}) segmented) grouped)")


def fill_unchanged(session: Session, sink: PostgresUpsertSink, staged: Mapping[str, Any]) -> list[Any]:
    """Replace the batch's placeholders of unchanged values in its staged rows by the values they stand for
    (`unchanged_values.resolve`), and give its deletes their keys' values, before its versions are added. A delete
    also fills the placeholders of a held create of an earlier batch at its position (a primary-key change whose
    create was read first, from another partition): the positions whose keys must then be rebuilt."""
    columns = fillable_columns(sink)
    if not columns:
        return []
    rows_of = staged_rows(quote(sink.staging_table), "s")
    params = {**staged, "mb_placeholder": sink.unavailable_value}
    holds = " OR ".join([*(f"s.{quote(c)} = :mb_placeholder" for c in columns), tombstone_sql(sink, "s")])
    if not session.execute(text(f"SELECT EXISTS (SELECT 1 FROM {rows_of} AND ({holds}))"), params).scalar_one():
        return []
    keys = len(sink.keys)
    order = f"s.{quote(sink.order_by)}" if sink.order_by else "NULL"
    changes = [StagedChange(tuple(row[:keys]), row[keys], row[keys + 1], dict(zip(columns, row[keys + 2:-3],
                                                                                 strict=True)), tuple(row[-3:]))
               for row in session.execute(text(
                   f"SELECT {_cols(sink.keys, 's')}, {order}, {tombstone_sql(sink, 's')}, {_cols(columns, 's')}, "
                   f"s.topic, s.partition, s.\"offset\" FROM {rows_of}"), staged)]
    match = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in sink.keys)
    stored = {tuple(row[:keys]): dict(zip(columns, row[keys:], strict=True)) for row in session.execute(text(
        f"SELECT {_cols(sink.keys, 't')}, {_cols(columns, 't')} FROM {quote(sink.table)} t "
        f"WHERE EXISTS (SELECT 1 FROM {rows_of} AND {match})"), staged)}

    def deleted_at(order: Any) -> dict[str, Any] | None:
        found = session.execute(text(
            f"SELECT {_cols(columns)} FROM {quote(versions_table(sink))} WHERE deleted AND {quote(sink.order_by)} = "
            f":order ORDER BY batch_id LIMIT 1"), {"order": order}).one_or_none() if sink.order_by else None
        return dict(zip(columns, found, strict=True)) if found is not None else None

    filled = resolve(changes, stored.get, deleted_at, sink.unavailable_value or "")
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}  # one executemany per set of columns written
    for (topic, partition, offset), values in filled.items():
        by_columns.setdefault(tuple(values), []).append(
            {**staged, **{f"v{i}": v for i, v in enumerate(values.values())}, "topic": topic, "partition": partition,
             "offset": offset})
    for written, rows in by_columns.items():
        assignments = ", ".join(f"{quote(c)} = :v{i}" for i, c in enumerate(written))
        session.execute(text(
            f"UPDATE {quote(sink.staging_table)} SET {assignments} WHERE batch_id = :batch_id AND attempt = :attempt "
            "AND topic = :topic AND partition = :partition AND \"offset\" = :offset"), rows)
    late = []
    for change in changes:
        if change.deleted and change.coordinates in filled and change.order is not None:
            values = {**change.values, **filled[change.coordinates]}
            fills = ", ".join(f"{quote(c)} = CASE WHEN {quote(c)} = :mb_placeholder THEN :v{i} ELSE {quote(c)} END"
                              for i, c in enumerate(columns))
            if session.execute(text(
                f"UPDATE {quote(versions_table(sink))} SET {fills} WHERE NOT deleted AND {quote(sink.order_by or '')} "
                f"= :order AND ({' OR '.join(f'{quote(c)} = :mb_placeholder' for c in columns)})"),
                    {**params, "order": change.order, **{f"v{i}": values[c] for i, c in enumerate(columns)}}).rowcount:
                late.append(change.order)
    return late


def add_versions_sql(sink: PostgresUpsertSink) -> str:
    """Keep this batch's greatest staged record per (topic, partition, key) as its versions."""
    columns = stored_columns(sink)
    partition_keys = _cols(["topic", "partition", *sink.keys], "s")
    if fillable_columns(sink):
        records = (f"(SELECT {_cols(columns)}, {tombstone_sql(sink, 'r')} AS deleted FROM "
                   f"{staged_rows(quote(sink.staging_table), 'r')}) staged")
        return (  # every change kept: a held create must still be found at its position (fill_unchanged)
            f"INSERT INTO {quote(versions_table(sink))} (batch_id, {_cols(columns)}, deleted) "
            f"SELECT :batch_id, {_cols(columns, 's')}, s.deleted "
            f"FROM {_filled(sink, records, ['topic', 'partition', *sink.keys])} s"
        )
    return (
        f"INSERT INTO {quote(versions_table(sink))} (batch_id, {_cols(columns)}, deleted) "
        f"SELECT DISTINCT ON ({partition_keys}) :batch_id, {_cols(columns, 's')}, {tombstone_sql(sink, 's')} "
        f"FROM {staged_rows(quote(sink.staging_table), 's')} "
        f"ORDER BY {partition_keys}, {_order(sink, 's')}"
    )


def _rebuild_sql(sink: PostgresUpsertSink, touched: str, excluded: str = "") -> list[str]:
    """Delete the rows of the keys in the relation `touched`, then insert each such key's winning version
    (unless it is a tombstone), ignoring versions that match `excluded`."""
    keys = _cols(sink.keys)
    match = " AND ".join(f"t.{quote(k)} = k.{quote(k)}" for k in sink.keys)
    vmatch = " AND ".join(f"v.{quote(k)} = k.{quote(k)}" for k in sink.keys)
    columns = stored_columns(sink)
    where = f" AND NOT ({excluded})" if excluded else ""
    delete = f"DELETE FROM {quote(sink.table)} t USING (SELECT DISTINCT {keys} FROM {touched}) k WHERE {match}"
    if fillable_columns(sink):
        versions = (f"(SELECT {_cols(columns, 'v')}, v.deleted FROM {quote(versions_table(sink))} v "
                    f"JOIN (SELECT DISTINCT {keys} FROM {touched}) k ON {vmatch}{where}) touched_versions")
        held = " AND ".join(f"w.{quote(c)} IS DISTINCT FROM {_literal(sink.unavailable_value or '')}"
                            for c in fillable_columns(sink))
        return [delete,
                f"INSERT INTO {quote(sink.table)} ({_cols(columns)}) SELECT {_cols(columns)} FROM ("
                f"SELECT DISTINCT ON ({_cols(sink.keys, 'v')}) v.* FROM {_filled(sink, versions, sink.keys)} v "
                f"ORDER BY {_cols(sink.keys, 'v')}, {_order(sink, 'v')}) w WHERE NOT w.deleted AND {held}"]
    return [
        delete,
        f"INSERT INTO {quote(sink.table)} ({_cols(columns)}) SELECT {_cols(columns)} FROM ("
        f"SELECT DISTINCT ON ({_cols(sink.keys, 'v')}) v.* FROM {quote(versions_table(sink))} v "
        f"JOIN (SELECT DISTINCT {keys} FROM {touched}) k ON {vmatch}{where} "
        f"ORDER BY {_cols(sink.keys, 'v')}, {_order(sink, 'v')}) w WHERE NOT w.deleted",
    ]


def merge_sql(sink: PostgresUpsertSink) -> list[str]:
    """The statements of a merge: add the batch's versions, then rebuild the keys it staged."""
    return [add_versions_sql(sink), *_rebuild_sql(sink, staged_rows(quote(sink.staging_table)))]


_SUPERSEDED = (f"EXISTS (SELECT 1 FROM {superseded_ranges('g')} AND g.batch_id = {{v}}.batch_id "
               "AND g.topic = {v}.topic AND g.partition = {v}.partition)")


def retract_sql(sink: PostgresUpsertSink) -> list[str]:
    """The statements of a replay's retraction: rebuild the keys that the superseded versions held from the
    other versions, then delete the superseded versions."""
    superseded = f"{quote(versions_table(sink))} r WHERE {_SUPERSEDED.format(v='r')}"
    return [
        *_rebuild_sql(sink, superseded, excluded=_SUPERSEDED.format(v="v")),
        f"DELETE FROM {quote(versions_table(sink))} r WHERE {_SUPERSEDED.format(v='r')}",
    ]


class PostgresUpsert(Sink):
    type = "postgres_upsert"
    row_audit = "kept"
    spec: PostgresUpsertSink

    def __init__(self, spec: PostgresUpsertSink) -> None:
        super().__init__(spec)
        delete = (spec.delete_column,) if spec.delete_column else ()
        self.staging = Staging(
            table=spec.staging_table,
            columns=(*spec.columns, *delete, *SOURCE_COORDINATES),
            fix="Return the sink's columns (and its delete_column) plus each record's source topic, partition "
                "and offset.",
        )

    @property
    def table(self) -> str:
        return self.spec.table

    def kept_rows(self, session: Session, ctx: CommitContext) -> int:
        """The versions the batch keeps (its greatest record per key of each partition it read)."""
        return count_kept(session, quote(versions_table(self.spec)), [ctx.batch_id])[ctx.batch_id]

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        return count_kept(session, quote(versions_table(self.spec)), list(ranges))

    @property
    def include_late(self) -> bool:
        return self.spec.include_late

    def tables(self, metadata: sa.MetaData) -> list[sa.Table]:
        spec = self.spec

        def columns() -> list[sa.Column]:
            return [sa.Column(name, sql_type(kind), nullable=name not in spec.keys)
                    for name, kind in spec.columns.items()]

        table = sa.Table(spec.table, metadata, *columns(), *coordinate_columns(),
                         sa.PrimaryKeyConstraint(*spec.keys, name=f"{spec.table}_pkey"))
        versions = sa.Table(
            versions_table(spec), metadata, sa.Column("batch_id", sa.BigInteger, nullable=False), *columns(),
            *coordinate_columns(), sa.Column("deleted", sa.Boolean, nullable=False),
            sa.Index(f"ix_{versions_table(spec)}_keys", *spec.keys),
            sa.Index(f"ix_{versions_table(spec)}_range", "batch_id", "topic", "partition"),
        )
        delete = [sa.Column(spec.delete_column, sa.Boolean, nullable=True)] if spec.delete_column else []
        staging = sa.Table(
            spec.staging_table, metadata, *staging_columns(),
            *(sa.Column(name, sql_type(kind), nullable=True) for name, kind in spec.columns.items()),
            *delete, *coordinate_columns(),
            sa.Index(f"ix_{spec.staging_table}_batch", "batch_id", "attempt"),
        )
        return [table, versions, staging]

    def check_staged(self, session: Session, ctx: CommitContext, recorded: int) -> None:
        """Also refuse a batch with a row whose key is null: no row can hold it, and a retry cannot help."""
        super().check_staged(session, ctx, recorded)
        null_key = " OR ".join(f"{quote(k)} IS NULL" for k in self.spec.keys)
        first = session.execute(text(
            f"SELECT topic, partition, \"offset\", count(*) OVER () FROM {staged_rows(quote(self.spec.staging_table))} "
            f"AND ({null_key}) "
            "ORDER BY topic, partition, \"offset\" LIMIT 1"), ctx.staged).one_or_none()
        if first is not None:
            topic, partition, offset, count = first
            raise SpecError(
                f"sink '{self.name}': {count} record(s) of batch {ctx.batch_id} have a null key "
                f"({', '.join(self.spec.keys)}), the first at {topic}[{partition}] offset {offset}; nothing was "
                "committed.",
                fix="Make the transform's parse() send such records to the dead letters (set its error column), "
                    "then run the pipeline again.")

    def retract(self, session: Session, ctx: CommitContext) -> int:
        touched = 0
        for statement in retract_sql(self.spec):
            touched += session.execute(text(statement), {"batch_id": ctx.batch_id}).rowcount
        return touched

    def merge(self, session: Session, ctx: CommitContext) -> int:
        late = fill_unchanged(session, self.spec, ctx.staged)
        add, delete, insert = merge_sql(self.spec)
        session.execute(text(add), ctx.staged)
        session.execute(text(delete), ctx.staged)
        merged = session.execute(text(insert), ctx.staged).rowcount
        if late:  # the held creates a delete of this batch filled: their keys rebuilt
            touched = f"{quote(versions_table(self.spec))} r WHERE r.{quote(self.spec.order_by or '')} = ANY(:late)"
            for statement in _rebuild_sql(self.spec, touched):
                session.execute(text(statement), {"late": late})
        return merged
