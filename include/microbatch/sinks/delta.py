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

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from microbatch.config import SOURCE_COORDINATES, DeltaSink, PipelineSpec
from microbatch.errors import MicrobatchError, SpecError
from microbatch.ledger import lake
from microbatch.ledger import repository as repo
from microbatch.ledger.models import OPEN_STATES, BatchState
from microbatch.runtime import cache_dir
from microbatch.sinks.audit import count_in_ranges, no_coordinates
from microbatch.sinks.base import (
    AFTER_LAKE_COMMIT,
    BEFORE_LAKE_COMMIT,
    AssetRef,
    CommitContext,
    LineagePlaces,
    RelandContext,
    Sink,
    StageContext,
    Staging,
    TableView,
    table_asset,
)
from microbatch.sinks.base import tombstone_sql as base_tombstone_sql
from microbatch.sinks.column_mappers import DELTA_TYPES
from microbatch.types import OffsetRange, TableWrite

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("microbatch.maintenance")
WAREHOUSE_ENV = "MICROBATCH_WAREHOUSE"
TXN_VERSION = 1
"""Delta keeps the greatest `txnVersion` per `txnAppId`; each batch has its own app id, so one version."""
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
"""The tasks Delta reads a table's log with into its snapshot (the sink's `snapshot_partitions`)."""
HISTORY_WINDOW = 500
"""How many recent versions the stage searches for its batch before reading the whole history."""

SPARK_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""What a Spark session (spark-submit, or the Connect server) needs to write Delta tables."""

COORDINATE_TYPES = {"topic": "string", "partition": "integer", "offset": "long"}
DELETED = "_deleted"
"""An upsert table's tombstone flag: the key's row is a tombstone (readers select `NOT _deleted`)."""
GENERATED = {"year": "YEAR({c})", "month": "DATE_TRUNC('MONTH', {c})", "day": "CAST({c} AS DATE)",
             "hour": "DATE_TRUNC('HOUR', {c})"}
GENERATED_TYPES = {"year": "integer", "month": "timestamp", "day": "date", "hour": "timestamp"}


def warehouse() -> str:
    """Where lakehouse tables live unless a sink's `path` says otherwise: `$MICROBATCH_WAREHOUSE`, or
    `<cache>/warehouse`."""
    return os.environ.get(WAREHOUSE_ENV) or str(cache_dir() / "warehouse")


def location(sink: DeltaSink) -> str:
    """The table's folder or URI."""
    path = sink.path or sink.name
    if "://" in path or Path(path).is_absolute():
        return path
    base = warehouse()
    return f"{base.rstrip('/')}/{path}" if "://" in base else str(Path(base) / path)


@dataclass(frozen=True)
class Owner:
    """Whose batches a table's commits are: a pipeline of one ledger (`pipelines.uid`), through one sink."""

    pipeline: str
    uid: str
    sink: str


def app_id(owner: Owner, batch_id: int) -> str:
    """Delta's idempotent-write key of one batch of one sink."""
    return f"microbatch/{owner.pipeline}/{owner.uid}/{owner.sink}/{batch_id}"


def commit_metadata(owner: Owner, batch_id: int, attempt: int, ranges: Sequence[OffsetRange],
                    reland: int | None = None) -> str:
    """The `userMetadata` of the batch's Delta commit: what it holds, readable by any Delta reader; a commit of
    `microbatch reland` carries the reland's number too."""
    return json.dumps({"microbatch": {
        "pipeline": owner.pipeline, "ledger": owner.uid, "sink": owner.sink, "batch_id": batch_id,
        "attempt": attempt,
        "ranges": [{"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in ranges],
        **({"reland": reland} if reland is not None else {}),
    }}, sort_keys=True)


def microbatch_meta(user_metadata: str | None, relands: bool = False) -> dict[str, Any] | None:
    """The microbatch part of a commit's `userMetadata`, or None for a commit microbatch did not make; a commit of
    `microbatch reland` only with `relands` (the batch's own commit stays the one the ledger recorded)."""
    if not user_metadata:
        return None
    try:
        meta = json.loads(user_metadata).get("microbatch")
    except (ValueError, AttributeError):
        return None
    if not isinstance(meta, dict) or "batch_id" not in meta or ("reland" in meta and not relands):
        return None
    return meta


def reland_metadata(owner: Owner, ctx: RelandContext) -> str:
    """The metadata of a reland's table commit."""
    return commit_metadata(owner, ctx.batch_id, ctx.attempt, ctx.ranges, reland=ctx.number)


def batch_of(user_metadata: str | None, owner: Owner) -> dict[str, Any] | None:
    """The microbatch part of a commit's `userMetadata` if `owner` made the commit, else None."""
    meta = microbatch_meta(user_metadata)
    if meta is None or (meta.get("pipeline"), meta.get("ledger"), meta.get("sink")) != (
            owner.pipeline, owner.uid, owner.sink):
        return None
    return meta


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


def table_fields(sink: DeltaSink) -> list[tuple[str, str, str | None]]:
    """(name, Delta type, generation expression) of every column of the table: the source coordinates first
    (Delta keeps min/max statistics of the first columns, so `replaceWhere` skips other ranges' files), then
    the spec's columns, then the generated partition columns."""
    fields: list[tuple[str, str, str | None]] = [(c, COORDINATE_TYPES[c], None) for c in SOURCE_COORDINATES]
    fields += [(name, DELTA_TYPES[type_], None) for name, type_ in sink.columns.items()]
    if sink.mode == "upsert":
        fields.append((DELETED, "boolean", None))
    for column, transform, source in sink.partition_columns:
        if transform is not None:
            fields.append((column, GENERATED_TYPES[transform], GENERATED[transform].format(c=source)))
    return fields


def written_columns(sink: DeltaSink) -> tuple[str, ...]:
    """The columns the stage writes (the generated ones Delta computes)."""
    extra = (sink.delete_column,) if sink.mode == "upsert" and sink.delete_column else ()
    return (*SOURCE_COORDINATES, *sink.columns, *extra)


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


@dataclass(frozen=True)
class LakeVersion:
    """The table version that holds a batch, as its history tells."""

    version: int
    rows: int
    attempt: int


def _history(loc: str, limit: int | None) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(loc).history(limit)


def _rows(entry: dict[str, Any]) -> int:
    metrics = entry.get("operationMetrics") or {}
    for key in ("numOutputRows", "numSourceRows"):
        if key in metrics:
            return int(metrics[key])
    return 0


def find_batch(loc: str, owner: Owner, batch_id: int) -> LakeVersion | None:
    """The version of the table that holds the batch, from its history (recent versions first)."""
    for limit in (HISTORY_WINDOW, None):
        entries = _history(loc, limit)
        for entry in entries:
            meta = batch_of(entry.get("userMetadata"), owner)
            if meta is not None and meta.get("batch_id") == batch_id:
                return LakeVersion(int(entry["version"]), _rows(entry), int(meta.get("attempt") or 0))
        if limit is not None and len(entries) < limit:
            return None
    return None


def batch_versions(loc: str, owner: Owner) -> tuple[dict[int, list[int]], list[int]]:
    """Every batch id of `owner` that the table's retained history holds, with the versions that hold it; and
    the versions microbatch made for someone else (another ledger, pipeline or sink)."""
    found: dict[int, list[int]] = {}
    foreign: list[int] = []
    for entry in _history(loc, None):
        meta = microbatch_meta(entry.get("userMetadata"))
        if meta is None:
            continue
        if batch_of(entry.get("userMetadata"), owner) is None:
            foreign.append(int(entry["version"]))
        else:
            found.setdefault(int(meta["batch_id"]), []).append(int(entry["version"]))
    return found, foreign


def oldest_version(loc: str) -> int:
    """The oldest version whose commit the table's log still holds."""
    return min(int(entry["version"]) for entry in _history(loc, None))


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
    for entry in _history(loc, HISTORY_WINDOW):
        if entry.get("userMetadata") == metadata:  # the commit just made (or skipped as made by a run before)
            version, rows = int(entry["version"]), _rows(entry)
            break
    else:
        raise MicrobatchError(f"sink '{sink.name}': the reland of batch {ctx.batch_id} is in no version of {loc}.",
                              fix="Run `microbatch reland` again.")
    with ctx.owned_ledger.transaction() as session:
        ledger_rows.record_reland(session, ctx.batch_id, sink.name, version, rows)
    return TableWrite(loc, version, rows, ctx.attempt, True)


class DeltaTableSink(Sink):
    """The `delta` sink: the stage writes the table (see the module's docstring); the ledger's commit checks
    that the version holding the batch is recorded, and commits it."""

    type = "delta"
    spark_session_conf = SPARK_SESSION_CONF
    writes_in_stage = True
    maintenance_summary = "Compact and vacuum the Delta tables"
    spec: DeltaSink

    def __init__(self, spec: DeltaSink) -> None:
        super().__init__(spec)
        self.row_audit = "coordinates" if spec.mode == "append" else None  # an upsert keeps each key's last row
        columns = written_columns(spec)
        self.staging = Staging(table="", columns=columns,
                               fix=f"Return a DataFrame with the columns {', '.join(columns)} for it from outputs().")

    @property
    def lake_location(self) -> str:
        return location(self.spec)

    @property
    def include_late(self) -> bool:
        """Late records land here too unless the spec says otherwise."""
        return self.spec.include_late

    @property
    def maintenance_schedule(self) -> str:
        return self.spec.maintenance.schedule

    def assets(self, pipeline: str) -> list[AssetRef]:
        """The table, by the sink's name (its location depends on where the task runs); the commit task updates
        it, when the ledger makes the batch's table version the committed one."""
        return [table_asset(pipeline, self.name)]

    def lineage_output(self, places: LineagePlaces, rows_by_sink: Mapping[str, int],
                       outbox: Mapping[str, tuple[int, int]], staged: Mapping[str, int]) -> tuple[str, str, int]:
        return "file", self.lake_location, int(staged.get(self.name, 0))

    @classmethod
    def driver_env(cls) -> dict[str, str]:
        """The warehouse, resolved in the task, so the driver writes where `microbatch verify` reads."""
        return {WAREHOUSE_ENV: warehouse()}

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

    def lake_view(self, limit: int, group_by: str | None) -> TableView:
        if group_by is not None and group_by not in self.spec.columns:
            raise SpecError(f"Sink '{self.name}' has no column '{group_by}'.",
                            fix=f"Use one of: {', '.join(self.spec.columns)}.")
        return table_view(self.spec, limit, group_by)

    def maintain(self, spark: SparkSession) -> None:
        maintain(spark, self.spec)

    def write_in_stage(self, rows: DataFrame, ctx: StageContext) -> TableWrite:
        BEFORE_LAKE_COMMIT.hit()  # Spark writes the files and the commit in one operation
        found, wrote = write_batch(rows, self.spec, Owner(ctx.pipeline, ctx.pipeline_uid, self.name), ctx.batch_id,
                                   ctx.attempt, ctx.ranges)
        AFTER_LAKE_COMMIT.hit()
        return TableWrite(self.lake_location, found.version, found.rows, found.attempt, wrote)

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        return count_in_ranges(coordinates(self.lake_location), ranges)

    def reland_table(self, rows: DataFrame, ctx: RelandContext) -> TableWrite:
        return reland(rows, self.spec, Owner(ctx.pipeline, ctx.pipeline_uid, self.name), ctx)

    def check_replay(self) -> None:
        """An upsert table keeps each key's winner only, not the history a replay recomputes it from."""
        if self.spec.mode == "upsert":
            raise SpecError(
                f"Backfill mode 'replay': sink '{self.name}' is a delta upsert table, which keeps only each key's "
                "last value and not the history a replay needs.",
                fix="Replay into a pipeline without it, or use a postgres_upsert sink, which keeps the history.")

    def check_staged(self, session: Session, ctx: CommitContext, recorded: int) -> None:
        if lake.lake_commit(session, ctx.batch_id, self.name) is None:
            raise MicrobatchError(
                f"Batch {ctx.batch_id}: no version of {self.lake_location} is recorded for sink {self.name}.",
                fix="Nothing was committed; the retry stages the batch, which finds or writes its version.")

    def merge(self, session: Session, ctx: CommitContext) -> int | None:
        recorded = lake.lake_commit(session, ctx.batch_id, self.name)
        assert recorded is not None, "check_staged refuses a batch without a recorded version"
        return recorded.rows

    def clear_staging(self, session: Session, ctx: CommitContext) -> None:
        return None


# --- the table's schema (delta-rs: no JVM) -------------------------------------------------------------


def _schema(sink: DeltaSink) -> Any:
    from deltalake import Field, Schema
    from deltalake.schema import PrimitiveType

    return Schema([
        Field(name, PrimitiveType(type_), nullable=name not in SOURCE_COORDINATES,
              metadata={"delta.generationExpression": expr} if expr else {})
        for name, type_, expr in table_fields(sink)
    ])


def existing_table(loc: str) -> Any | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(loc)
    except TableNotFoundError:
        return None


def differences(sink: DeltaSink, table: Any) -> tuple[list[Any], str | None]:
    """(fields to add, the first refused difference as a sentence) between the spec and the table."""
    from deltalake import Field
    from deltalake.schema import PrimitiveType

    loc = location(sink)
    have = {f.name: f for f in table.schema().fields}
    want = table_fields(sink)
    for name, type_, _ in want:
        if name in have and str(getattr(have[name].type, "type", have[name].type)) != type_:
            found = getattr(have[name].type, "type", have[name].type)
            return [], (f"Delta table {loc} column {name} is {found} but the spec says {type_}; change the spec back, "
                        "or write to a new table (a new path) and backfill it")
    partitions = [c for c, _, _ in sink.partition_columns]
    if list(table.metadata().partition_columns) != partitions:
        return [], (f"Delta table {loc} is partitioned by {list(table.metadata().partition_columns) or 'nothing'} "
                    f"but the spec says {partitions or 'nothing'}; change partition_by back, or write to a new path")
    dropped = [name for name in have if name not in {n for n, _, _ in want}]
    if dropped:
        return [], (f"Delta table {loc} has the column {dropped[0]}, which the spec no longer declares; declare it "
                    "again (a dropped column is not applied)")
    added = [Field(n, PrimitiveType(t), nullable=True) for n, t, expr in want if n not in have and expr is None]
    new_generated = [n for n, _, expr in want if n not in have and expr is not None]
    if new_generated:
        return [], f"Delta table {loc} lacks the generated column {new_generated[0]}; write to a new path"
    return added, None


def migrate_table(sink: DeltaSink) -> list[str]:
    """Create the table, or add the spec's new columns; what was done. A refused change raises `SpecError`."""
    from deltalake import DeltaTable

    loc = location(sink)
    table = existing_table(loc)
    if table is None:
        if "://" not in loc:
            Path(loc).mkdir(parents=True, exist_ok=True)
        DeltaTable.create(loc, _schema(sink), partition_by=[c for c, _, _ in sink.partition_columns] or None,
                          name=sink.name, description=f"microbatch sink {sink.name} ({sink.mode})")
        return [f"create delta table {loc}"]
    added, refused = differences(sink, table)
    if refused:
        raise SpecError(f"sink '{sink.name}': {refused}.")
    if added:
        table.alter.add_columns(added)
    return [f"add column {f.name} to delta table {loc}" for f in added]


def check_table(spec: PipelineSpec, sink: DeltaSink) -> None:
    """Refuse (one sentence, terminal) a batch whose Delta table is missing or differs from the spec."""
    loc = location(sink)
    table = existing_table(loc)
    if table is None:
        raise SpecError(f"{spec.name}: Delta table {loc} of sink '{sink.name}' does not exist; run "
                        "`microbatch migrate`, which creates it from the spec.")
    added, refused = differences(sink, table)
    if refused:
        raise SpecError(f"{spec.name}: {refused}.")
    if added:
        raise SpecError(f"{spec.name}: Delta table {loc} lacks the column {added[0].name} the spec declares; run "
                        "`microbatch migrate`, which adds it.")


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
        first = min(recorded, default=None)
        expected = sorted(b for b, state in states.items()
                          if state == BatchState.COMMITTED and first is not None and b >= first)
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
    if group_by is not None:
        counted = data.group_by(group_by).aggregate([(group_by, "count")]).sort_by(
            [(f"{group_by}_count", "descending"), (group_by, "ascending")])
        columns = [group_by, "rows"]
        rows = list(zip(counted[group_by].to_pylist()[:limit], counted[f"{group_by}_count"].to_pylist()[:limit],
                        strict=True))
    else:
        order = pc.sort_indices(data, sort_keys=[("topic", "ascending"), ("partition", "ascending"),
                                                 ("offset", "descending")])
        newest = data.take(order[:limit])
        columns = [c for c in newest.column_names if c not in {gen for gen, t, _ in sink.partition_columns if t}]
        rows = [tuple(r[c] for c in columns) for r in newest.to_pylist()]
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
