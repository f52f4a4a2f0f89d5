"""`delta`'s writes, by Spark: the stage's one idempotent commit per batch (an append's `replaceWhere` over the
batch's ranges, an upsert's `MERGE` of each key's winner) and the reland's; each found again in the table's history."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from microbatch.config import SOURCE_COORDINATES, DeltaSink
from microbatch.errors import MicrobatchError
from microbatch.sinks.audit import no_coordinates
from microbatch.sinks.base import tombstone_sql as base_tombstone_sql
from microbatch.sinks.contexts import RelandContext
from microbatch.sinks.delta_table import (
    COORDINATE_TYPES,
    DELETED,
    HISTORY_WINDOW,
    SNAPSHOT_PARTITIONS,
    LakeVersion,
    commit_rows,
    existing_table,
    find_batch,
    history,
    written_columns,
)
from microbatch.sinks.lakehouse import Owner, commit_metadata, location, reland_metadata
from microbatch.types import OffsetRange, TableWrite

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TXN_VERSION = 1
"""Delta keeps the greatest `txnVersion` per `txnAppId`; each batch has its own app id, so one version."""


def app_id(owner: Owner, batch_id: int) -> str:
    """Delta's idempotent-write key of one batch of one sink."""
    return f"microbatch/{owner.pipeline}/{owner.uid}/{owner.sink}/{batch_id}"


def replace_where(ranges: Iterable[OffsetRange]) -> str:
    """The predicate selecting the rows of `ranges` (half-open offset ranges per topic and partition)."""
    parts = [
        f"(`topic` = '{r.topic.replace(chr(39), chr(39) * 2)}' AND `partition` = {int(r.partition)} "
        f"AND `offset` >= {int(r.start)} AND `offset` < {int(r.end)})"
        for r in ranges
    ]
    if not parts:
        raise ValueError("a batch has at least one range")
    return " OR ".join(parts)


def tombstone_sql(sink: DeltaSink, alias: str) -> str:
    """The upsert sinks' tombstone rule (`sinks/base.tombstone_sql`) in Spark SQL."""
    return base_tombstone_sql(sink, alias, lambda column: f"`{column}`")


def merge_sql(sink: DeltaSink, target: str, source_view: str) -> str:
    """The upsert's MERGE: the batch's winner per key replaces the table's row (a tombstone's too) when it is
    greater by (order_by, nulls lowest; then the coordinates); a key the table lacks is inserted, tombstone or
    not, so that the key's order survives its deletion."""
    order = [*([sink.order_by] if sink.order_by else []), *SOURCE_COORDINATES]

    def newer(s: str, t: str) -> str:
        # Lexicographic (s.a, s.b, ...) > (t.a, t.b, ...), null-safe, a null lowest.
        terms = []
        for i, col in enumerate(order):
            equal = " AND ".join(f"{s}.`{c}` <=> {t}.`{c}`" for c in order[:i])
            greater = f"({s}.`{col}` > {t}.`{col}` OR ({t}.`{col}` IS NULL AND {s}.`{col}` IS NOT NULL))"
            terms.append(f"({equal + ' AND ' if equal else ''}{greater})")
        return "(" + " OR ".join(terms) + ")"

    on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in sink.keys)
    stored = [*SOURCE_COORDINATES, *sink.columns]
    deleted = tombstone_sql(sink, "s")
    sets = ", ".join([*(f"`{c}` = s.`{c}`" for c in stored), f"`{DELETED}` = {deleted}"])
    cols = ", ".join([*(f"`{c}`" for c in stored), f"`{DELETED}`"])
    vals = ", ".join([*(f"s.`{c}`" for c in stored), deleted])
    return (f"MERGE INTO delta.`{target}` AS t USING {source_view} AS s ON {on} "
            f"WHEN MATCHED AND {newer('s', 't')} THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({vals})")


def winners(df: DataFrame, sink: DeltaSink) -> DataFrame:
    """The batch's last record per key, by (order_by, topic, partition, offset)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    order = [*([sink.order_by] if sink.order_by else []), *SOURCE_COORDINATES]
    window = Window.partitionBy(*sink.keys).orderBy(*[F.col(c).desc_nulls_last() for c in order])
    return df.withColumn("_rank", F.row_number().over(window)).where("_rank = 1").drop("_rank")


def write_batch(df: DataFrame, sink: DeltaSink, owner: Owner, batch_id: int, attempt: int,
                ranges: Sequence[OffsetRange]) -> tuple[LakeVersion, bool]:
    """Write one batch's rows into the table as ONE idempotent Delta commit (Spark's executors write the
    files); return the version that holds the batch and whether this call wrote it."""
    loc = location(sink)
    found = find_batch(loc, owner, batch_id)
    if found is not None:
        return found, False
    df.sparkSession.conf.set(SNAPSHOT_PARTITIONS, str(sink.snapshot_partitions))
    key = app_id(owner, batch_id)
    metadata = commit_metadata(owner, batch_id, attempt, ranges)
    rows = df.select(*written_columns(sink))
    if sink.mode == "append":
        (rows.write.format("delta").mode("overwrite").option("replaceWhere", replace_where(ranges))
         .option("txnAppId", key).option("txnVersion", TXN_VERSION).option("userMetadata", metadata).save(loc))
    else:
        spark = df.sparkSession
        view = f"microbatch_{sink.name}_{batch_id}"
        winners(rows, sink).createOrReplaceTempView(view)
        settings = {"spark.databricks.delta.write.txnAppId": key,
                    "spark.databricks.delta.write.txnVersion": str(TXN_VERSION),
                    "spark.databricks.delta.commitInfo.userMetadata": metadata}
        try:
            for name, value in settings.items():
                spark.conf.set(name, value)
            spark.sql(merge_sql(sink, loc, view)).collect()
        finally:
            for name in settings:
                spark.conf.unset(name)
            spark.catalog.dropTempView(view)
    found = find_batch(loc, owner, batch_id)
    if found is None:
        raise MicrobatchError(
            f"sink '{sink.name}': Delta skipped the write of batch {batch_id} as already done, but the table's "
            "history holds no version with that batch.",
            fix="The table's log was cleaned below the batch; check delta.logRetentionDuration of the table.")
    return found, found.attempt == attempt


def coordinates(loc: str) -> Any:
    """The source coordinates of every row of the table at `loc`, as Arrow (none if it has no table)."""
    table = existing_table(loc)
    if table is None:
        return no_coordinates()
    return table.to_pyarrow_table(columns=list(COORDINATE_TYPES))


def reland(df: DataFrame, sink: DeltaSink, owner: Owner, ctx: RelandContext) -> TableWrite:
    """`microbatch reland` of an append table: the rows of the batch's ranges replaced by `df` in ONE Delta commit
    (`replaceWhere`, its own idempotent key), recorded in the ledger; the version it made."""
    from microbatch.ledger import rows as ledger_rows

    loc = location(sink)
    metadata = reland_metadata(owner, ctx)
    (df.select(*written_columns(sink)).write.format("delta").mode("overwrite")
     .option("replaceWhere", replace_where(ctx.ranges)).option("txnAppId", f"{app_id(owner, ctx.batch_id)}/reland")
     .option("txnVersion", ctx.number).option("userMetadata", metadata).save(loc))
    for entry in history(loc, HISTORY_WINDOW):
        if entry.get("userMetadata") == metadata:  # the commit just made (or skipped as made by a run before)
            version, rows = int(entry["version"]), commit_rows(entry)
            break
    else:
        raise MicrobatchError(f"sink '{sink.name}': the reland of batch {ctx.batch_id} is in no version of {loc}.",
                              fix="Run `microbatch reland` again.")
    with ctx.owned_ledger.transaction() as session:
        ledger_rows.record_reland(session, ctx.batch_id, sink.name, version, rows)
    return TableWrite(loc, version, rows, ctx.attempt, True)
