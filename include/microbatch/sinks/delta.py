"""`delta`: a Delta Lake table that Spark's executors write, exactly once per batch, with the ledger as witness.

Two systems commit: the table (a new version in its `_delta_log`) and the ledger (Postgres). The table's commit
comes first, in the stage, and is made idempotent and self-describing:

- **One Delta commit per batch**, with Delta's idempotent-write key `txnAppId = microbatch/<pipeline>/<sink>/
  <batch_id>`, `txnVersion = 1`. Delta records the key in the same atomic log entry, and skips any later write
  with it: a retry after the table's commit, a second attempt, or a zombie attempt of the batch adds nothing.
- **The commit says what it holds**: its `userMetadata` is `{"microbatch": {pipeline, sink, batch_id, attempt,
  ranges}}`. Before writing, the stage looks for the batch in the table's recent history; after writing (or
  being skipped), it reads the version that holds the batch from there and records it in the ledger's
  `lake_commits` (batch, sink, version, rows). The ledger's commit then refuses a batch whose version is not
  recorded, and commits it otherwise: a crash between the two commits is finished by the retry, which finds
  the version and writes nothing.
- **Append** writes with `replaceWhere` over the batch's own offset ranges: the rows of those offsets are
  replaced by the batch's in the same commit. For a new range that deletes nothing; for a replay it is the
  replacement of the replayed ranges, in ONE commit; and a batch abandoned after its table commit (its offsets
  planned again) cannot leave a second copy of its rows.
- **Upsert** is one `MERGE` (with the same key, through Delta's `spark.databricks.delta.write.txnAppId` SQL
  settings): the batch's last record per key wins over the table's row if it is greater by (`order_by`,
  nulls lowest, then topic, partition, offset), as in `postgres_upsert`. A tombstone (`delete_column` true, or
  every value column null) stays as the key's row with `_deleted` true, as a compacted topic keeps it, so
  that a later batch's older record cannot bring the key back; readers select `NOT _deleted`. A replay of an
  upsert table is refused: the table keeps only each key's winner, not the history a replay would need (the
  Postgres upsert sink keeps it).
- **Aggregate** is not a mode of this sink: a sum would be a read-modify-write of the table per batch, and the
  retraction of a replay needs per-batch contributions, which `postgres_aggregate` keeps in Postgres.

`microbatch migrate` creates the table with delta-rs (`deltalake`, no JVM), from the spec's columns plus the
source coordinates, with generated columns for `day(ts)`-style partitions; additive changes (a new column)
are applied, any other difference refused in one sentence. The plan checks the table the same way before
it opens a batch. `microbatch verify` checks every committed batch against the table's history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from microbatch.config import DeltaSink, PipelineSpec
from microbatch.errors import MicrobatchError, SpecError
from microbatch.ledger import lake
from microbatch.ledger import repository as repo
from microbatch.ledger.models import OPEN_STATES
from microbatch.sinks.audit import count_in_ranges
from microbatch.sinks.base import AFTER_LAKE_COMMIT, BEFORE_LAKE_COMMIT
from microbatch.sinks.base import tombstone_sql as base_tombstone_sql
from microbatch.sinks.contexts import RelandContext, StageContext, TableView
from microbatch.sinks.delta_table import (
    COORDINATE_TYPES,
    DELETED,
    DELTA_TYPES,
    GENERATED,
    GENERATED_TYPES,
    HISTORY_WINDOW,
    SNAPSHOT_PARTITIONS,
    LakeVersion,
    batch_versions,
    check_table,
    differences,
    existing_table,
    find_batch,
    migrate_table,
    oldest_version,
    table_fields,
    written_columns,
)
from microbatch.sinks.delta_write import (
    TXN_VERSION,
    app_id,
    coordinates,
    merge_sql,
    reland,
    replace_where,
    tombstone_sql,
    winners,
    write_batch,
)
from microbatch.sinks.lakehouse import (
    WAREHOUSE_ENV,
    LakehouseSink,
    Owner,
    batch_of,
    commit_metadata,
    expected_batches,
    location,
    microbatch_meta,
    reland_metadata,
    view_rows,
    warehouse,
)
from microbatch.types import OffsetRange, TableWrite

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [  # what the module held before it was split by job (issue 62), importable from here as before
    "COORDINATE_TYPES", "DELETED", "DELTA_TYPES", "GENERATED", "GENERATED_TYPES", "HISTORY_WINDOW",
    "LISTING_PARALLELISM", "SNAPSHOT_PARTITIONS", "SPARK_SESSION_CONF", "TXN_VERSION", "WAREHOUSE_ENV",
    "DeltaTableSink", "LakeVersion", "Owner", "app_id", "audit", "base_tombstone_sql", "batch_of", "batch_versions",
    "check_table", "commit_metadata", "coordinates", "differences", "existing_table", "find_batch", "location",
    "maintain", "merge_sql", "microbatch_meta", "migrate_table", "oldest_version", "reland", "reland_metadata",
    "replace_where", "table_fields", "table_view", "tombstone_sql", "warehouse", "winners", "write_batch",
    "written_columns",
]

log = logging.getLogger("microbatch.maintenance")
SPARK_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""What a Spark session (spark-submit, or the Connect server) needs to write Delta tables."""


class DeltaTableSink(LakehouseSink):
    """The `delta` sink: the stage writes the table (see the module's docstring); the ledger's commit checks
    that the version holding the batch is recorded, and commits it."""

    type = "delta"
    spark_session_conf = SPARK_SESSION_CONF
    maintenance_summary = "Compact and vacuum the Delta tables"
    spec: DeltaSink

    def __init__(self, spec: DeltaSink) -> None:
        super().__init__(spec)
        self.row_audit = "coordinates" if spec.mode == "append" else None  # an upsert keeps each key's last row

    def staged_columns(self) -> tuple[str, ...]:
        return written_columns(self.spec)

    def lake_refusal(self, ledger_url: str) -> str | None:
        table = existing_table(self.lake_location)
        refused = table is not None and differences(self.spec, table)[1]
        return refused or None

    def migrate_lake(self, ledger_url: str) -> list[str]:
        return migrate_table(self.spec)

    def check_lake(self, spec: PipelineSpec, ledger_url: str) -> None:
        check_table(spec, self.spec)

    def audit(self, session: Session, spec: PipelineSpec, pipeline_id: int, uid: str) -> tuple[list[str], list[str]]:
        return audit(session, spec, [self.spec], pipeline_id, uid)

    def table_view(self, limit: int, group_by: str | None) -> TableView:
        return table_view(self.spec, limit, group_by)

    def maintain(self, spark: SparkSession) -> None:
        maintain(spark, self.spec)

    def write_in_stage(self, rows: DataFrame, ctx: StageContext) -> TableWrite:
        BEFORE_LAKE_COMMIT.hit()  # Spark writes the files and the commit in one operation
        found, wrote = write_batch(rows, self.spec, self.owner(ctx), ctx.batch_id, ctx.attempt, ctx.ranges)
        AFTER_LAKE_COMMIT.hit()
        return TableWrite(self.lake_location, found.version, found.rows, found.attempt, wrote)

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        return count_in_ranges(coordinates(self.lake_location), ranges)

    def reland_table(self, rows: DataFrame, ctx: RelandContext) -> TableWrite:
        return reland(rows, self.spec, self.owner(ctx), ctx)

    def check_replay(self) -> None:
        """An upsert table keeps each key's winner only, not the history a replay recomputes it from."""
        if self.spec.mode == "upsert":
            raise SpecError(
                f"Backfill mode 'replay': sink '{self.name}' is a delta upsert table, which keeps only each key's "
                "last value and not the history a replay needs.",
                fix="Replay into a pipeline without it, or use a postgres_upsert sink, which keeps the history.")


# --- the audit (`microbatch verify`) and the lookup (`microbatch find`) ---------------------------------


def audit(session: Session, spec: PipelineSpec, sinks: Sequence[DeltaSink], pipeline_id: int, uid: str
          ) -> tuple[list[str], list[str]]:
    """Each table of `sinks` against the ledger: every committed batch (since the sink's first) in exactly one
    version of the table, the version the ledger recorded; no version of this pipeline's with a batch the
    ledger has not committed. Versions older than the table's retained log are audited from the ledger's
    record alone. Returns (one summary line per table, problems)."""
    lines: list[str] = []
    problems: list[str] = []
    states = repo.batch_states(session, pipeline_id)
    for sink in sinks:
        loc = location(sink)
        recorded = lake.lake_versions(session, pipeline_id, sink.name)
        if existing_table(loc) is None:
            problems.append(f"delta {sink.name}: no table at {loc}")
            continue
        held, foreign = batch_versions(loc, Owner(spec.name, uid, sink.name))
        oldest = oldest_version(loc)
        expected = expected_batches(states, recorded)
        expired = 0
        for batch_id in expected:
            versions = held.get(batch_id, [])
            if len(versions) > 1:
                problems.append(f"delta {sink.name}: batch {batch_id} is in versions {versions} of {loc}")
            elif not versions:
                if recorded.get(batch_id) is not None and recorded[batch_id] < oldest:
                    expired += 1
                else:
                    problems.append(f"delta {sink.name}: committed batch {batch_id} is in no version of {loc}")
            elif recorded.get(batch_id) != versions[0]:
                problems.append(f"delta {sink.name}: batch {batch_id} is in version {versions[0]} of {loc}, the ledger "
                                f"recorded {recorded.get(batch_id)}")
        in_flight = [b for b in held if states.get(b) in OPEN_STATES]
        strays = sorted(b for b in held if b not in expected and b not in in_flight)
        problems += [f"delta {sink.name}: version {held[b][0]} of {loc} holds batch {b}, which the ledger has "
                     f"{states.get(b, 'never planned')}" for b in strays]
        lines.append(f"delta {sink.name}: {len(expected)} committed batches, each in one version of {loc}"
                     f"{f' ({expired} audited from the ledger, older than the retained log)' if expired else ''}"
                     f"{f', {len(in_flight)} in flight' if in_flight else ''}"
                     f"{f', {len(foreign)} versions by another pipeline or ledger' if foreign else ''}")
    return lines, problems


def table_view(sink: DeltaSink, limit: int, group_by: str | None = None) -> TableView:
    """The newest rows of the table (by source coordinates), or with `group_by` the row count per value of that
    column, largest first: a query of the table by delta-rs and Arrow, no Spark. A table without files (as
    `migrate` made it, or after empty writes) is 0 rows; a missing table, or one whose files are gone, is a
    `MicrobatchError` sentence."""
    import pyarrow.compute as pc

    from microbatch.errors import error_summary

    loc = location(sink)
    table = existing_table(loc)
    if table is None:
        raise SpecError(f"Delta table {loc} of sink '{sink.name}' does not exist.",
                        fix="Run `microbatch migrate`, which creates it from the spec.")
    try:
        data = table.to_pyarrow_table()
    except OSError as exc:  # a file the table's version references is gone
        raise MicrobatchError(f"Delta table {loc} of sink '{sink.name}' cannot be read ({error_summary(exc)}).",
                              fix="Restore its files there: its log still references them.") from exc
    if DELETED in data.column_names:  # an upsert table: its tombstones are not rows of the view
        data = data.filter(pc.invert(pc.fill_null(data[DELETED], False))).drop_columns([DELETED])
    columns, rows = view_rows(data, limit, group_by, {gen for gen, t, _ in sink.partition_columns if t})
    return TableView(loc, table.version(), len(table.file_uris()), data.num_rows, columns, rows, "delta-rs")


# --- the maintenance DAG (`spark_jobs/maintain_lake.py`) -----------------------------------------------

LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def maintain(spark: SparkSession, sink: DeltaSink) -> None:
    """Compact the table's small files (OPTIMIZE), then remove the files no retained version needs (VACUUM)."""
    loc = location(sink)
    spark.conf.set(SNAPSHOT_PARTITIONS, str(sink.snapshot_partitions))
    before = _files(spark, loc)
    started = time.monotonic()
    optimized = spark.sql(f"OPTIMIZE delta.`{loc}`").collect()
    metrics = optimized[0]["metrics"] if optimized else None
    compacted = time.monotonic() - started
    after = _files(spark, loc)
    log.info("%s: OPTIMIZE %s: %s files -> %s files (%s removed, %s added) in %.1fs", sink.name, loc, before, after,
             getattr(metrics, "numFilesRemoved", "?"), getattr(metrics, "numFilesAdded", "?"), compacted)
    started = time.monotonic()
    # A retention below Delta's 7-day floor needs its safety check off, as Delta's own docs say.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled",
                   "false" if sink.maintenance.retain_hours < 168 else "true")
    # VACUUM lists the table's directories in this many tasks (Spark's default: 10,000, whatever the size).
    spark.conf.set(LISTING_PARALLELISM, str(sink.maintenance.listing_tasks))
    spark.sql(f"VACUUM delta.`{loc}` RETAIN {int(sink.maintenance.retain_hours)} HOURS").collect()
    log.info("%s: VACUUM %s retaining %s hours, listing in %s tasks, in %.1fs", sink.name, loc,
             sink.maintenance.retain_hours, sink.maintenance.listing_tasks, time.monotonic() - started)


def _files(spark: SparkSession, loc: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{loc}`").collect()[0]["numFiles"])
