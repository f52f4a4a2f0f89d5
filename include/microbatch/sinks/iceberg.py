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
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from microbatch.config import IcebergSink, PipelineSpec
from microbatch.errors import MicrobatchError, SpecError
from microbatch.ledger import lake
from microbatch.ledger import repository as repo
from microbatch.ledger.models import OPEN_STATES
from microbatch.settings import ledger_url as configured_ledger_url
from microbatch.sinks.audit import count_in_ranges
from microbatch.sinks.contexts import RelandContext, StageContext, TableView
from microbatch.sinks.iceberg_table import (
    CATALOG,
    COORDINATES,
    ICEBERG_TYPES,
    SUMMARY_KEY,
    LakeSnapshot,
    catalog,
    check_table,
    differences,
    find_batch,
    identifier,
    load,
    migrate_table,
    partition_text,
    snapshot_summaries,
    snapshots_by_batch,
    summary_properties,
    table_columns,
)
from microbatch.sinks.iceberg_write import (
    OUTPUT_TIMESTAMP,
    SPARK_TYPES,
    checked_files,
    coordinates,
    partition_keys,
    ranges_filter,
    reland,
    write_batch,
    write_files,
)
from microbatch.sinks.lake_files import (
    ATTEMPT_DIR,
    attempt_folder,
    data_files,
    file_mtime,
    file_rows,
    list_files,
    normal_path,
    orphan_folders,
    remove_folder,
)
from microbatch.sinks.lakehouse import LakehouseSink, Owner, expected_batches, fenced, location, view_rows
from microbatch.types import OffsetRange, TableWrite

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

__all__ = [  # what the module defined before it was split by job (issue 62), importable from here as before
    "ATTEMPT_DIR", "CATALOG", "COORDINATES", "ICEBERG_TYPES", "OUTPUT_TIMESTAMP", "SPARK_TYPES", "SUMMARY_KEY",
    "IcebergTableSink", "LakeSnapshot", "attempt_folder", "audit", "catalog", "check_table", "checked_files",
    "coordinates", "data_files", "differences", "fenced", "file_mtime", "file_rows", "find_batch", "identifier",
    "list_files", "load", "location", "maintain", "migrate_table", "normal_path", "orphan_folders", "orphans",
    "partition_keys", "partition_text", "ranges_filter", "referenced_files", "reland", "remove_folder",
    "snapshot_summaries", "snapshots_by_batch", "summary_properties", "table_columns", "table_view", "write_batch",
    "write_files",
]

log = logging.getLogger("microbatch.maintenance")


class IcebergTableSink(LakehouseSink):
    """The `iceberg` sink: the stage writes the batch's files and commits them as one snapshot (see the module's
    docstring); the ledger's commit checks that the snapshot holding the batch is recorded, and commits it."""

    type = "iceberg"
    row_audit = "coordinates"
    maintenance_summary = "Remove the orphaned data files of the Iceberg tables"
    holding = "snapshot"
    spec: IcebergSink

    @property
    def table_name(self) -> str:
        return f"the Iceberg table {'.'.join(identifier(self.spec))}"

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

    def table_view(self, limit: int, group_by: str | None) -> TableView:
        return table_view(self.spec, configured_ledger_url(), limit, group_by)

    def holding_text(self, location: str, version: int) -> str:
        return f"iceberg {self.name}: in snapshot {version} of {'.'.join(identifier(self.spec))} ({location})"

    def maintain(self, spark: SparkSession) -> None:
        """In the maintenance job's driver, whose environment names the ledger (and the catalog in it); the
        removal itself needs no Spark."""
        maintain(self.spec, configured_ledger_url())

    def write_in_stage(self, rows: DataFrame, ctx: StageContext) -> TableWrite:
        found, wrote = write_batch(rows, self.spec, self.owner(ctx), ctx)
        return TableWrite(self.lake_location, found.snapshot_id, found.rows, found.attempt, wrote)

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        url = session.get_bind().url.render_as_string(hide_password=False)
        return count_in_ranges(coordinates(load(self.spec, url)), ranges)

    def reland_table(self, rows: DataFrame, ctx: RelandContext) -> TableWrite:
        return reland(rows, self.spec, self.owner(ctx), ctx)

    def check_replay(self) -> None:
        raise SpecError(
            f"Backfill mode 'replay': sink '{self.name}' is an iceberg table, which microbatch cannot replay into "
            "yet; nothing was written.",
            fix="Backfill with --mode fill, or replay a pipeline without an iceberg sink.")


# --- the audit (`microbatch verify`), the maintenance (`microbatch maintain`) and the view (`microbatch show`) ---


def referenced_files(table: Table) -> set[str]:
    """Every data file that a snapshot of the table references."""
    if not any(snapshot.manifests(table.io) for snapshot in table.snapshots()):
        return set()  # only empty snapshots: pyiceberg's all_files() has no table to concatenate then
    return {normal_path(p) for p in table.inspect.all_files().column("file_path").to_pylist()}


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
    held, foreign = snapshots_by_batch(snapshot_summaries(table), Owner(spec.name, uid, sink.name))
    expected = expected_batches(states, recorded)
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
        if paths and all(file_mtime(p) <= cutoff for p in paths):
            remove_folder(folder)
            removed += len(paths)
            log.info("%s: removed the orphaned attempt folder %s (%s files)", sink.name, folder, len(paths))
    log.info("%s: %s orphaned data files removed from %s", sink.name, removed, location(sink))


def table_view(sink: IcebergSink, url: str, limit: int, group_by: str | None) -> TableView:
    """The newest rows of the table (by source coordinates), or the row count per value of `group_by`, read by
    pyiceberg's scan, no Spark. A table with no snapshot, or none but empty ones (an APPEND of no file), is 0
    rows; a missing table, or one whose files are gone, is a `MicrobatchError` sentence."""
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
    columns, rows = view_rows(data, limit, group_by)
    snapshot = table.current_snapshot()
    return TableView(location(sink), snapshot.snapshot_id if snapshot else 0, files, data.num_rows, columns, rows,
                     "pyiceberg")
