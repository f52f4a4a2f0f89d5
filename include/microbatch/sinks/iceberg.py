"""`iceberg`: an Apache Iceberg table, append only, exactly once per batch, with the ledger as witness.

Iceberg publishes no Spark runtime for Spark 4.2, so Spark does not commit the table. The stage splits the write
the way Iceberg's own Kafka Connect sink does (workers write data files, one coordinator commits them):

- **Spark's executors write the batch's Parquet files** into a folder of the attempt, `<table>/data/
  microbatch-<batch>-<attempt>/`, with timestamps as microseconds (not INT96) and split by the table's partition
  values, so that each file holds one partition value of the table's spec (pyiceberg infers it from the file's
  statistics).
- **ONE pyiceberg commit adds them** (`add_files`), whose snapshot summary holds the batch: the property
  `microbatch` is `{pipeline, ledger, sink, batch_id, attempt, ranges}` (as a Delta commit's `userMetadata`).
  The catalog is pyiceberg's SQL catalog in the ledger's own PostgreSQL database (its `iceberg_tables` row is the
  table's pointer, swapped by compare-and-set); the warehouse is `MICROBATCH_WAREHOUSE`, a local folder by default.

Two commits, one outcome, as for Delta (docs/sinks.md says why the catalog's pointer swap is not made part of the
ledger's commit): before writing, the stage looks for the batch in the table's snapshots and writes nothing if it
is there; the table's commit happens inside `fenced`, a ledger transaction that holds the batch's row locked and
refuses an attempt that is no longer the current one, so a zombie never adds a snapshot; the snapshot is recorded in
`lake_commits` in that same transaction; the ledger's commit refuses a batch whose snapshot is not recorded. A
crash between the table's commit and its record is finished by the retry, which finds the snapshot.

Files of an attempt that never committed (a crash before the table's commit, a zombie) are referenced by no
snapshot: `microbatch verify` lists them, and the maintenance DAG (`microbatch maintain`) removes them.
`microbatch migrate` creates the table from the spec (columns, the source coordinates, a partition spec from
`partition_by`) with pyiceberg, and makes additive changes only. A replay into an Iceberg table is refused.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from microbatch.column_types import LOCAL_TIME, ZONED_TIME
from microbatch.config import SOURCE_COORDINATES, IcebergSink, PipelineSpec
from microbatch.errors import MicrobatchError, RowCountError, SpecError
from microbatch.ledger import lake
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger
from microbatch.ledger.models import OPEN_STATES, BatchState
from microbatch.settings import ledger_url as configured_ledger_url
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
from microbatch.sinks.column_mappers import ICEBERG_SPARK_TYPES as SPARK_TYPES
from microbatch.sinks.column_mappers import ICEBERG_TYPES, iceberg_type
from microbatch.sinks.delta import (
    WAREHOUSE_ENV,
    Owner,
    batch_of,
    commit_metadata,
    microbatch_meta,
    reland_metadata,
    warehouse,
)
from microbatch.types import OffsetRange, TableWrite

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("microbatch.maintenance")
CATALOG = "microbatch"
"""The catalog's name, the `catalog_name` of its rows in `iceberg_tables`."""
SUMMARY_KEY = "microbatch"
"""The snapshot summary's property that holds the batch."""
OUTPUT_TIMESTAMP = "spark.sql.parquet.outputTimestampType"
ATTEMPT_DIR = re.compile(r"microbatch-(\d+)-(\d+)")

COORDINATES = {"topic": "text", "partition": "integer", "offset": "bigint"}


def location(sink: IcebergSink) -> str:
    """The table's folder or URI: `path` as a Delta sink's, else the sink's name under the warehouse."""
    path = sink.path or sink.name
    if "://" in path or Path(path).is_absolute():
        return path
    base = warehouse()
    return f"{base.rstrip('/')}/{path}" if "://" in base else str(Path(base) / path)


def identifier(sink: IcebergSink) -> tuple[str, str]:
    """(namespace, table) of the table in the catalog."""
    return sink.namespace, sink.table or sink.name


def table_columns(sink: IcebergSink) -> list[tuple[str, str]]:
    """(name, spec type) of every column of the table: the source coordinates, then the spec's columns."""
    return [*COORDINATES.items(), *sink.columns.items()]


def attempt_folder(loc: str, batch_id: int, attempt: int) -> str:
    """Where one attempt's Spark job writes the batch's data files."""
    return f"{loc.rstrip('/')}/data/microbatch-{batch_id}-{attempt}"


def summary_properties(owner: Owner, batch_id: int, attempt: int, ranges: Sequence[Any]) -> dict[str, str]:
    """The snapshot summary's properties of the batch's commit."""
    return {SUMMARY_KEY: commit_metadata(owner, batch_id, attempt, ranges)}


@dataclass(frozen=True)
class LakeSnapshot:
    """The snapshot that holds a batch, as the table's snapshots tell."""

    snapshot_id: int
    rows: int
    attempt: int


def snapshots_by_batch(snapshots: Iterable[tuple[int, Mapping[str, str]]], owner: Owner
                       ) -> tuple[dict[int, list[LakeSnapshot]], list[int]]:
    """From (snapshot id, summary) pairs: every batch of `owner` with the snapshots that hold it, and the snapshots
    microbatch made for someone else (another ledger, pipeline or sink)."""
    found: dict[int, list[LakeSnapshot]] = {}
    foreign: list[int] = []
    for snapshot_id, summary in snapshots:
        raw = summary.get(SUMMARY_KEY)
        if microbatch_meta(raw) is None:
            continue
        meta = batch_of(raw, owner)
        if meta is None:
            foreign.append(snapshot_id)
            continue
        rows = int(summary.get("added-records") or 0)
        found.setdefault(int(meta["batch_id"]), []).append(
            LakeSnapshot(snapshot_id, rows, int(meta.get("attempt") or 0)))
    return found, foreign


def orphan_folders(files: Iterable[str], referenced: set[str], open_batches: set[int]) -> dict[str, list[str]]:
    """The attempt folders (by path) whose files no snapshot references, of batches that are not open: what an
    attempt that never committed left. `files` are every file under the table's `data/`; a folder with a
    referenced file is never an orphan, nor one that microbatch did not name."""
    by_folder: dict[str, list[str]] = {}
    for path in files:
        folder, _, rest = path.partition("/data/")
        name = rest.split("/", 1)[0]
        match = ATTEMPT_DIR.fullmatch(name)
        if match is None or int(match.group(1)) in open_batches:
            continue
        by_folder.setdefault(f"{folder}/data/{name}", []).append(path)
    return {folder: sorted(paths) for folder, paths in sorted(by_folder.items())
            if not any(_normal(p) in referenced for p in paths)}


def _normal(path: str) -> str:
    return path.removeprefix("file://")


# --- the catalog and the table (pyiceberg) ---------------------------------------------------------------


def catalog(url: str, init: bool = False) -> SqlCatalog:
    """pyiceberg's SQL catalog in the ledger's database `url` (one per process, URL and warehouse); with `init` its
    two tables are created if missing (only `microbatch migrate` does that: no DDL at run time)."""
    return _catalog(url, warehouse(), init)


@lru_cache(maxsize=8)
def _catalog(url: str, base: str, init: bool) -> SqlCatalog:
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return SqlCatalog(CATALOG, uri=parsed.render_as_string(hide_password=False),
                      warehouse=base if "://" in base else f"file://{base}",
                      init_catalog_tables="true" if init else "false")


def load(sink: IcebergSink, url: str) -> Table | None:
    """The sink's table, or None if the catalog has none."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog(url).load_table(identifier(sink))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except FileNotFoundError as exc:  # the catalog's row points at a metadata file that is gone
        namespace, name = identifier(sink)
        raise SpecError(f"Iceberg table {namespace}.{name} of sink '{sink.name}' is in the catalog, but its metadata "
                        f"file under {location(sink)} is gone (its warehouse was removed or moved).",
                        fix="Restore the warehouse there, or drop the table from the catalog (DELETE FROM "
                        f"iceberg_tables WHERE catalog_name = '{CATALOG}' AND table_namespace = '{namespace}' AND "
                        f"table_name = '{name}') and run `microbatch migrate`, which creates it empty.") from exc
    except Exception as exc:  # the catalog's tables are missing: `migrate` creates them
        if "iceberg_tables" in str(exc):
            return None
        raise


def _schema(sink: IcebergSink) -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    return Schema(*[NestedField(field_id=i + 1, name=name, field_type=_type(type_), required=False)
                    for i, (name, type_) in enumerate(table_columns(sink))])


def _type(spec_type: str) -> Any:
    return iceberg_type(spec_type)


def _transform(name: str | None) -> Any:
    from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, MonthTransform, YearTransform

    return {None: IdentityTransform(), "year": YearTransform(), "month": MonthTransform(), "day": DayTransform(),
            "hour": HourTransform()}[name]


def _partition_spec(sink: IcebergSink, schema: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec

    return PartitionSpec(*[
        PartitionField(source_id=schema.find_field(source).field_id, field_id=1000 + i,
                       transform=_transform(transform), name=name)
        for i, (name, transform, source) in enumerate(sink.partition_columns)])


def partition_text(sink: IcebergSink, table: Table) -> tuple[list[str], list[str]]:
    """(the table's partition fields, the spec's) as `transform(column)` terms, to compare."""
    schema = table.schema()
    have = [f"{field.transform}({schema.find_field(field.source_id).name})" for field in table.spec().fields]
    want = [f"{transform or 'identity'}({source})" for _, transform, source in sink.partition_columns]
    return have, want


def differences(sink: IcebergSink, table: Table) -> tuple[list[tuple[str, str]], str | None]:
    """(columns to add, the first refused difference as a sentence) between the spec and the table."""
    name = ".".join(identifier(sink))
    have = {field.name: str(field.field_type) for field in table.schema().fields}
    want = table_columns(sink)
    for column, type_ in want:
        if column in have and have[column] != ICEBERG_TYPES[type_]:
            return [], (f"Iceberg table {name} column {column} is {have[column]} but the spec says "
                        f"{ICEBERG_TYPES[type_]}; change the spec back, or write to a new table and backfill it")
    dropped = [column for column in have if column not in dict(want)]
    if dropped:
        return [], (f"Iceberg table {name} has the column {dropped[0]}, which the spec no longer declares; declare it "
                    "again (a dropped column is not applied)")
    partitions, wanted = partition_text(sink, table)
    if partitions != wanted:
        return [], (f"Iceberg table {name} is partitioned by {partitions or 'nothing'} but the spec says "
                    f"{wanted or 'nothing'}; change partition_by back, or write to a new table")
    return [(column, type_) for column, type_ in want if column not in have], None


def migrate_table(sink: IcebergSink, url: str) -> list[str]:
    """Create the catalog's tables and the table, or add the spec's new columns; what was done. A refused change
    raises `SpecError`."""
    from pyiceberg.table.name_mapping import create_mapping_from_schema

    cat = catalog(url, init=True)
    namespace, name = identifier(sink)
    cat.create_namespace_if_not_exists(namespace)
    table = load(sink, url)
    if table is None:
        schema = _schema(sink)
        mapping = create_mapping_from_schema(schema).model_dump_json()
        cat.create_table((namespace, name), schema, location=location(sink),
                         partition_spec=_partition_spec(sink, schema),
                         properties={"schema.name-mapping.default": mapping,
                                     "comment": f"microbatch sink {sink.name} (append)"})
        return [f"create iceberg table {namespace}.{name} at {location(sink)}"]
    added, refused = differences(sink, table)
    if refused:
        raise SpecError(f"sink '{sink.name}': {refused}.")
    if added:
        with table.update_schema() as update:
            for column, type_ in added:
                update.add_column(column, _type(type_))
    return [f"add column {column} to iceberg table {namespace}.{name}" for column, _ in added]


def check_table(spec: PipelineSpec, sink: IcebergSink, url: str) -> None:
    """Refuse (one sentence, terminal) a batch whose Iceberg table is missing or differs from the spec."""
    name = ".".join(identifier(sink))
    table = load(sink, url)
    if table is None:
        raise SpecError(f"{spec.name}: Iceberg table {name} of sink '{sink.name}' does not exist; run "
                        "`microbatch migrate`, which creates it from the spec.")
    added, refused = differences(sink, table)
    if refused:
        raise SpecError(f"{spec.name}: {refused}.")
    if added:
        raise SpecError(f"{spec.name}: Iceberg table {name} lacks the column {added[0][0]} the spec declares; run "
                        "`microbatch migrate`, which adds it.")


def _snapshots(table: Table) -> list[tuple[int, Mapping[str, str]]]:
    return [(s.snapshot_id, s.summary or {}) for s in table.snapshots()]


def find_batch(table: Table, owner: Owner, batch_id: int) -> LakeSnapshot | None:
    """The snapshot of the table that holds the batch (the first, if a broken table holds it twice)."""
    held = snapshots_by_batch(_snapshots(table), owner)[0].get(batch_id)
    return held[0] if held else None


# --- the stage's write (Spark writes the files, pyiceberg commits them) ------------------------------------


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


def data_files(folder: str, paths: Iterable[str]) -> list[str]:
    """The Parquet files among `paths` (every file under `folder`) that the write committed: not a file whose name
    starts with `.` or `_` (a checksum, a marker), nor one in a hidden folder or Spark's `_temporary` below
    `folder` (the partition folders are `_p0=...`). Only the part below `folder` is looked at: the folder itself
    may be anywhere, the default warehouse `.cache/warehouse` included."""
    root = folder.rstrip("/") + "/"
    kept = []
    for path in paths:
        *folders, name = (path[len(root):] if path.startswith(root) else path.rsplit("/", 1)[-1]).split("/")
        hidden = name.startswith((".", "_")) or any(f.startswith(".") or f == "_temporary" for f in folders)
        if name.endswith(".parquet") and not hidden:
            kept.append(path)
    return kept


def file_rows(paths: Iterable[str]) -> int:
    """The rows the Parquet files hold, from their footers (no data read)."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    total = 0
    for path in paths:
        filesystem, inner = fs.FileSystem.from_uri(path if "://" in path else f"file://{os.path.abspath(path)}")
        with filesystem.open_input_file(inner) as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


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


def list_files(folder: str) -> list[str]:
    """Every file under `folder` (recursively), as paths or URIs as `folder` is given; [] if it does not exist."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(folder if "://" in folder else f"file://{os.path.abspath(folder)}")
    try:
        infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    prefix = folder[: folder.index("://") + 3] if "://" in folder else ""
    return sorted(prefix + info.path for info in infos if info.type == fs.FileType.File)


def remove_folder(folder: str) -> None:
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(folder if "://" in folder else f"file://{os.path.abspath(folder)}")
    filesystem.delete_dir(root)


@contextmanager
def fenced(ledger: Ledger, sink: str, batch_id: int, attempt: int) -> Iterator[Session]:
    """A ledger transaction that holds the batch's row locked (`FOR UPDATE`) after refusing (ZombieAttemptError) an
    attempt that is no longer the batch's current one: a table commit made inside it cannot be a zombie's, since a
    newer attempt begins, and the ledger commits the batch, only by updating that row. The snapshot is recorded
    inside it too (`lake.record_table_write`), so that the table's commit and its record are apart only if the
    process dies between them, which the retry finishes by finding the batch in the table."""
    with ledger.transaction() as session:
        repo.get_batch(session, batch_id, lock=True)
        lake.refuse_zombie(session, sink, batch_id, attempt)
        yield session


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


# --- the audit (`microbatch verify`) and the maintenance (`microbatch maintain`) -------------------------


def referenced_files(table: Table) -> set[str]:
    """Every data file that a snapshot of the table references."""
    if not any(snapshot.manifests(table.io) for snapshot in table.snapshots()):
        return set()  # only empty snapshots: pyiceberg's all_files() has no table to concatenate then
    return {_normal(p) for p in table.inspect.all_files().column("file_path").to_pylist()}


def orphans(sink: IcebergSink, table: Table, open_batches: set[int]) -> dict[str, list[str]]:
    """The attempt folders of the table whose files no snapshot references, of batches that are not open."""
    return orphan_folders(list_files(f"{location(sink).rstrip('/')}/data"), referenced_files(table), open_batches)


def audit(session: Session, spec: PipelineSpec, sink: IcebergSink, pipeline_id: int, uid: str
          ) -> tuple[list[str], list[str]]:
    """The table against the ledger: every committed batch (since the sink's first) in exactly one snapshot, the
    one the ledger recorded; no snapshot of this pipeline's with a batch the ledger has not committed; and the
    orphaned files of attempts that never committed, listed (not a problem: `microbatch maintain` removes them)."""
    name = ".".join(identifier(sink))
    url = session.get_bind().url.render_as_string(hide_password=False)
    table = load(sink, url)
    if table is None:
        return [], [f"iceberg {sink.name}: no table {name} in the catalog"]
    states = repo.batch_states(session, pipeline_id)
    recorded = lake.lake_versions(session, pipeline_id, sink.name)
    held, foreign = snapshots_by_batch(_snapshots(table), Owner(spec.name, uid, sink.name))
    first = min(recorded, default=None)
    expected = sorted(b for b, state in states.items()
                      if state == BatchState.COMMITTED and first is not None and b >= first)
    problems = []
    for batch_id in expected:
        snapshots = [s.snapshot_id for s in held.get(batch_id, [])]
        if len(snapshots) != 1:
            problems.append(f"iceberg {sink.name}: committed batch {batch_id} is in {len(snapshots)} snapshots of "
                            f"{name} ({snapshots}), not one")
        elif recorded.get(batch_id) != snapshots[0]:
            problems.append(f"iceberg {sink.name}: batch {batch_id} is in snapshot {snapshots[0]} of {name}, the "
                            f"ledger recorded {recorded.get(batch_id)}")
    open_batches = {b for b, state in states.items() if state in OPEN_STATES}
    strays = sorted(b for b in held if b not in expected and b not in open_batches)
    problems += [f"iceberg {sink.name}: snapshot {held[b][0].snapshot_id} of {name} holds batch {b}, which the "
                 f"ledger has {states.get(b, 'never planned')}" for b in strays]
    lines = [f"iceberg {sink.name}: {len(expected)} committed batches, each in one snapshot of {name}"
             f"{f', {len(foreign)} snapshots by another pipeline or ledger' if foreign else ''}"]
    left = orphans(sink, table, open_batches)
    if left:
        lines.append(f"iceberg {sink.name}: {sum(map(len, left.values()))} orphaned data files of {len(left)} "
                     f"attempts that never committed, which `microbatch maintain` removes: {', '.join(left)}")
    return lines, problems


def maintain(sink: IcebergSink, url: str) -> None:
    """Remove the attempt folders whose files no snapshot references, of batches that are no longer open and older
    than `maintenance.retain_hours`."""
    from sqlalchemy.exc import NoResultFound

    from microbatch.ledger.database import transaction

    table = load(sink, url)
    if table is None:
        raise SpecError(f"Iceberg table {'.'.join(identifier(sink))} of sink '{sink.name}' does not exist.",
                        fix="Run `microbatch migrate`, which creates it from the spec.")
    files = list_files(f"{location(sink).rstrip('/')}/data")
    batches = {int(m.group(1)) for p in files for m in ATTEMPT_DIR.finditer(p)}
    open_batches = set()
    with transaction(url) as session:
        for batch_id in batches:
            try:
                if repo.get_batch(session, batch_id).state in OPEN_STATES:
                    open_batches.add(batch_id)
            except NoResultFound:
                continue
    cutoff = time.time() - sink.maintenance.retain_hours * 3600
    removed = 0
    for folder, paths in orphan_folders(files, referenced_files(table), open_batches).items():
        if paths and all(_mtime(p) <= cutoff for p in paths):
            remove_folder(folder)
            removed += len(paths)
            log.info("%s: removed the orphaned attempt folder %s (%s files)", sink.name, folder, len(paths))
    log.info("%s: %s orphaned data files removed from %s", sink.name, removed, location(sink))


def _mtime(path: str) -> float:
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(path if "://" in path else f"file://{os.path.abspath(path)}")
    info = filesystem.get_file_info(root)
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def table_view(sink: IcebergSink, url: str, limit: int, group_by: str | None) -> TableView:
    """The newest rows of the table (by source coordinates), or the row count per value of `group_by`, read by
    pyiceberg's scan, no Spark. A table with no snapshot, or none but empty ones (an APPEND of no file), is 0
    rows; a missing table, or one whose files are gone, is a `MicrobatchError` sentence."""
    import pyarrow.compute as pc

    from microbatch.errors import error_summary

    table = load(sink, url)
    if table is None:
        raise SpecError(f"Iceberg table {'.'.join(identifier(sink))} of sink '{sink.name}' does not exist.",
                        fix="Run `microbatch migrate`, which creates it from the spec.")
    scan = table.scan()
    try:
        # The current snapshot's data files, from its manifests (not `inspect.data_files()`: it fails on a snapshot
        # with no manifest, as an empty APPEND).
        files = len(list(scan.plan_files()))
        data = scan.to_arrow()
    except OSError as exc:  # a file the snapshot references is gone
        raise MicrobatchError(f"Iceberg table {'.'.join(identifier(sink))} of sink '{sink.name}' at {location(sink)} "
                              f"cannot be read ({error_summary(exc)}).",
                              fix="Restore its files there: the catalog in the ledger's database still points at "
                              "them.") from exc
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
        columns = newest.column_names
        rows = [tuple(r[c] for c in columns) for r in newest.to_pylist()]
    snapshot = table.current_snapshot()
    return TableView(location(sink), snapshot.snapshot_id if snapshot else 0, files, data.num_rows, columns, rows,
                     "pyiceberg")


class IcebergTableSink(Sink):
    """The `iceberg` sink: the stage writes the batch's files and commits them as one snapshot (see the module's
    docstring); the ledger's commit checks that the snapshot holding the batch is recorded, and commits it."""

    type = "iceberg"
    writes_in_stage = True
    row_audit = "coordinates"
    maintenance_summary = "Remove the orphaned data files of the Iceberg tables"
    spec: IcebergSink

    def __init__(self, spec: IcebergSink) -> None:
        super().__init__(spec)
        columns = (*SOURCE_COORDINATES, *spec.columns)
        self.staging = Staging(table="", columns=columns,
                               fix=f"Return a DataFrame with the columns {', '.join(columns)} for it from outputs().")

    @property
    def lake_location(self) -> str:
        return location(self.spec)

    @property
    def include_late(self) -> bool:
        return self.spec.include_late

    @property
    def maintenance_schedule(self) -> str:
        return self.spec.maintenance.schedule

    def assets(self, pipeline: str) -> list[AssetRef]:
        return [table_asset(pipeline, self.name)]

    def lineage_output(self, places: LineagePlaces, rows_by_sink: Mapping[str, int],
                       outbox: Mapping[str, tuple[int, int]], staged: Mapping[str, int]) -> tuple[str, str, int]:
        return "file", self.lake_location, int(staged.get(self.name, 0))

    @classmethod
    def driver_env(cls) -> dict[str, str]:
        """The warehouse, resolved in the task, so the driver writes where `microbatch verify` reads."""
        return {WAREHOUSE_ENV: warehouse()}

    def lake_refusal(self, ledger_url: str) -> str | None:
        table = load(self.spec, ledger_url)
        refused = table is not None and differences(self.spec, table)[1]
        return refused or None

    def migrate_lake(self, ledger_url: str) -> list[str]:
        return migrate_table(self.spec, ledger_url)

    def check_lake(self, spec: PipelineSpec, ledger_url: str) -> None:
        check_table(spec, self.spec, ledger_url)

    def audit(self, session: Session, spec: PipelineSpec, pipeline_id: int, uid: str) -> tuple[list[str], list[str]]:
        return audit(session, spec, self.spec, pipeline_id, uid)

    def lake_view(self, limit: int, group_by: str | None) -> TableView:
        if group_by is not None and group_by not in self.spec.columns:
            raise SpecError(f"Sink '{self.name}' has no column '{group_by}'.",
                            fix=f"Use one of: {', '.join(self.spec.columns)}.")
        return table_view(self.spec, configured_ledger_url(), limit, group_by)

    def holding_text(self, location: str, version: int) -> str:
        return f"iceberg {self.name}: in snapshot {version} of {'.'.join(identifier(self.spec))} ({location})"

    def maintain(self, spark: SparkSession) -> None:
        """In the maintenance job's driver, whose environment names the ledger (and the catalog in it); the
        removal itself needs no Spark."""
        maintain(self.spec, configured_ledger_url())

    def write_in_stage(self, rows: DataFrame, ctx: StageContext) -> TableWrite:
        found, wrote = write_batch(rows, self.spec, Owner(ctx.pipeline, ctx.pipeline_uid, self.name), ctx)
        return TableWrite(self.lake_location, found.snapshot_id, found.rows, found.attempt, wrote)

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        url = session.get_bind().url.render_as_string(hide_password=False)
        return count_in_ranges(coordinates(load(self.spec, url)), ranges)

    def reland_table(self, rows: DataFrame, ctx: RelandContext) -> TableWrite:
        return reland(rows, self.spec, Owner(ctx.pipeline, ctx.pipeline_uid, self.name), ctx)

    def check_replay(self) -> None:
        raise SpecError(
            f"Backfill mode 'replay': sink '{self.name}' is an iceberg table, which microbatch cannot replay into "
            "yet; nothing was written.",
            fix="Backfill with --mode fill, or replay a pipeline without an iceberg sink.")

    def check_staged(self, session: Session, ctx: CommitContext, recorded: int) -> None:
        if lake.lake_commit(session, ctx.batch_id, self.name) is None:
            raise MicrobatchError(
                f"Batch {ctx.batch_id}: no snapshot of the Iceberg table {'.'.join(identifier(self.spec))} is "
                f"recorded for sink {self.name}.",
                fix="Nothing was committed; the retry stages the batch, which finds or writes its snapshot.")

    def merge(self, session: Session, ctx: CommitContext) -> int | None:
        recorded = lake.lake_commit(session, ctx.batch_id, self.name)
        assert recorded is not None, "check_staged refuses a batch without a recorded snapshot"
        return recorded.rows

    def clear_staging(self, session: Session, ctx: CommitContext) -> None:
        return None

