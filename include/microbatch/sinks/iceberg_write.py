"""`iceberg`'s writes: Spark's executors write the batch's Parquet files into the attempt's folder (one partition
value per file, timestamps as microseconds), their rows are checked against what the stage handed the sink, and ONE
pyiceberg commit adds them inside the ledger's fence, which records the snapshot; the reland's likewise."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from microbatch.column_types import LOCAL_TIME, ZONED_TIME
from microbatch.config import IcebergSink
from microbatch.errors import MicrobatchError, RowCountError, SpecError
from microbatch.ledger import lake
from microbatch.sinks.audit import no_coordinates
from microbatch.sinks.base import AFTER_LAKE_COMMIT, BEFORE_LAKE_COMMIT
from microbatch.sinks.column_mappers import ICEBERG_SPARK_TYPES as SPARK_TYPES
from microbatch.sinks.contexts import RelandContext, StageContext
from microbatch.sinks.iceberg_table import (
    COORDINATES,
    SUMMARY_KEY,
    LakeSnapshot,
    find_batch,
    identifier,
    load,
    summary_properties,
    table_columns,
)
from microbatch.sinks.lake_files import attempt_folder, data_files, file_rows, list_files
from microbatch.sinks.lakehouse import Owner, fenced, location, reland_metadata
from microbatch.types import OffsetRange, TableWrite

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame

log = logging.getLogger("microbatch.maintenance")
OUTPUT_TIMESTAMP = "spark.sql.parquet.outputTimestampType"



def partition_keys(sink: IcebergSink) -> list[Column]:
    """One Spark column per partition field whose value is the same for two rows exactly when the table's
    transform is (in UTC, as Iceberg's): Spark's `partitionBy` over them makes each file hold one partition value."""
    from pyspark.sql import functions as F

    keys = []
    for _, transform, source in sink.partition_columns:
        column, type_ = F.col(source), sink.columns.get(source)
        if transform is None:
            keys.append(column)
            continue
        if type_ == ZONED_TIME:
            micros = F.unix_micros(column)
            day = F.floor(micros / 86_400_000_000)
            hour = F.floor(micros / 3_600_000_000)
        else:  # a timestamp without time zone or a date: their calendar fields need no time zone
            day = F.unix_date(F.to_date(column))
            hour = day * 24 + F.hour(column) if type_ == LOCAL_TIME else None
        date = F.date_from_unix_date(day.cast("int"))
        keys.append({"day": day, "hour": hour, "month": F.year(date) * 12 + F.month(date),
                     "year": F.year(date)}[transform])
    return keys


def write_files(rows: DataFrame, sink: IcebergSink, folder: str) -> list[str]:
    """Spark's executors write `rows` as Parquet files under `folder` (replacing what an earlier run of the same
    attempt left), timestamps as microseconds, one partition value per file; the files' paths."""
    from pyspark.sql import functions as F

    spark = rows.sparkSession
    columns = [F.col(name).cast(SPARK_TYPES[type_]).alias(name) for name, type_ in table_columns(sink)]
    keys = [key.alias(f"_p{i}") for i, key in enumerate(partition_keys(sink))]
    out = rows.select(*columns, *keys)
    previous = spark.conf.get(OUTPUT_TIMESTAMP, None)
    spark.conf.set(OUTPUT_TIMESTAMP, "TIMESTAMP_MICROS")  # Iceberg reads no INT96
    try:
        (out.write.mode("overwrite").partitionBy(*[f"_p{i}" for i in range(len(keys))])
         .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false").parquet(folder))
    finally:
        if previous is None:
            spark.conf.unset(OUTPUT_TIMESTAMP)
        else:
            spark.conf.set(OUTPUT_TIMESTAMP, previous)
    return data_files(folder, list_files(folder))


def checked_files(rows: DataFrame, sink: IcebergSink, folder: str, ctx: StageContext) -> list[str]:
    """`write_files`, then the rows the files hold (their footers) against the rows the stage handed the sink
    (counted as Spark wrote them): a difference fails the attempt before the table's commit, so nothing counts."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    handed = Observation(f"iceberg_{sink.name}_{ctx.batch_id}_{ctx.attempt}")
    files = write_files(rows.observe(handed, F.count(F.lit(1)).alias("rows")), sink, folder)
    expected, held = int(handed.get["rows"]), file_rows(files)
    if held != expected:
        raise RowCountError(
            f"sink '{sink.name}': batch {ctx.batch_id} attempt {ctx.attempt} handed the table {expected} rows but "
            f"its {len(files)} data files under {folder} hold {held}; nothing was committed.",
            fix="The retry writes the batch again; if it repeats, check what else writes or removes files there.")
    log.info("  %s: %s rows in %s data files, as the stage handed them", sink.name, held, len(files))
    return files


def write_batch(rows: DataFrame, sink: IcebergSink, owner: Owner, ctx: StageContext) -> tuple[LakeSnapshot, bool]:
    """Write one batch into the table as ONE Iceberg snapshot (Spark writes the files, pyiceberg adds them inside
    the ledger's fence, which records the snapshot); the snapshot that holds the batch, and whether this call made
    it."""
    if ctx.ledger is None:
        raise MicrobatchError(f"sink '{sink.name}': the stage wrote no ledger into the sink's context.",
                              fix="Write the table through sinks.base.write_table, which passes the ledger.")
    url = ctx.ledger.url
    table = load(sink, url)
    if table is None:
        raise SpecError(f"Iceberg table {'.'.join(identifier(sink))} of sink '{sink.name}' does not exist.",
                        fix="Run `microbatch migrate`, which creates it from the spec.")
    found = find_batch(table, owner, ctx.batch_id)
    if found is not None:
        return found, False
    files = checked_files(rows, sink, attempt_folder(location(sink), ctx.batch_id, ctx.attempt), ctx)
    BEFORE_LAKE_COMMIT.hit()
    with fenced(ctx.ledger, sink.name, ctx.batch_id, ctx.attempt) as session:
        table = table.refresh()
        found = find_batch(table, owner, ctx.batch_id)
        wrote = found is None
        if found is None:
            # No scan of the table's files for duplicates (its cost grows with the table): the files are new, in
            # this attempt's own folder, and the batch is in no snapshot, as checked under the fence just now.
            table.add_files(files, snapshot_properties=summary_properties(owner, ctx.batch_id, ctx.attempt, ctx.ranges),
                            check_duplicate_files=False)
            found = find_batch(table, owner, ctx.batch_id)
            assert found is not None, "the commit just made holds the batch"
            AFTER_LAKE_COMMIT.hit()
        lake.record_table_write(session, ctx.pipeline_id, sink.name, ctx.batch_id, ctx.attempt,
                                TableWrite(location(sink), found.snapshot_id, found.rows, found.attempt, wrote))
    return found, wrote


def coordinates(table: Table | None) -> Any:
    """The source coordinates of every row of the table, as Arrow (none for no table, or no snapshot)."""
    if table is None or table.current_snapshot() is None:
        return no_coordinates()
    return table.scan(selected_fields=tuple(COORDINATES)).to_arrow()


def ranges_filter(ranges: Sequence[OffsetRange]) -> Any:
    """A pyiceberg row filter selecting the rows of `ranges`."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan, Or

    terms = [And(EqualTo("topic", r.topic), EqualTo("partition", r.partition), GreaterThanOrEqual("offset", r.start),
                 LessThan("offset", r.end)) for r in ranges]
    return terms[0] if len(terms) == 1 else Or(*terms)


def reland(rows: DataFrame, sink: IcebergSink, owner: Owner, ctx: RelandContext) -> TableWrite:
    """`microbatch reland`: Spark writes the batch's files into a reland folder of their own, then ONE pyiceberg
    transaction deletes the rows of the batch's ranges and adds the files, recorded in the ledger."""
    from microbatch.ledger import rows as ledger_rows

    ledger = ctx.owned_ledger
    table = load(sink, ledger.url)
    if table is None:
        raise SpecError(f"Iceberg table {'.'.join(identifier(sink))} of sink '{sink.name}' does not exist.",
                        fix="Run `microbatch migrate`, which creates it from the spec.")
    folder = f"{location(sink).rstrip('/')}/data/microbatch-{ctx.batch_id}-reland{ctx.number}"
    files = checked_files(rows, sink, folder, ctx)
    properties = {SUMMARY_KEY: reland_metadata(owner, ctx)}
    with table.transaction() as tx:
        tx.delete(delete_filter=ranges_filter(ctx.ranges), snapshot_properties=properties)
        tx.add_files(files, snapshot_properties=properties, check_duplicate_files=False)
    table = table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot is not None, "the reland's transaction made a snapshot"
    added = int((snapshot.summary or {}).get("added-records") or 0)
    with ledger.transaction() as session:
        ledger_rows.record_reland(session, ctx.batch_id, sink.name, snapshot.snapshot_id, added)
    return TableWrite(location(sink), snapshot.snapshot_id, added, ctx.attempt, True)
