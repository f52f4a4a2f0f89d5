"""`delta`'s table, read and made with delta-rs (no JVM): its columns and their Delta types, its schema as the
spec says it (`microbatch migrate` creates it or adds columns; the plan refuses a batch while it differs), and its
history, where each commit names the batch it holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microbatch.config import SOURCE_COORDINATES, DeltaSink, PipelineSpec
from microbatch.errors import SpecError
from microbatch.sinks.column_mappers import DELTA_TYPES
from microbatch.sinks.lakehouse import Owner, batch_of, location, microbatch_meta

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
"""The tasks Delta reads a table's log with into its snapshot (the sink's `snapshot_partitions`)."""
HISTORY_WINDOW = 500
"""How many recent versions the stage searches for its batch before reading the whole history."""

COORDINATE_TYPES = {"topic": "string", "partition": "integer", "offset": "long"}
DELETED = "_deleted"
"""An upsert table's tombstone flag: the key's row is a tombstone (readers select `NOT _deleted`)."""
GENERATED = {"year": "YEAR({c})", "month": "DATE_TRUNC('MONTH', {c})", "day": "CAST({c} AS DATE)",
             "hour": "DATE_TRUNC('HOUR', {c})"}
GENERATED_TYPES = {"year": "integer", "month": "timestamp", "day": "date", "hour": "timestamp"}


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


# --- the table's history: which version holds which batch ----------------------------------------------


@dataclass(frozen=True)
class LakeVersion:
    """The table version that holds a batch, as its history tells."""

    version: int
    rows: int
    attempt: int


def history(loc: str, limit: int | None) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(loc).history(limit)


def commit_rows(entry: dict[str, Any]) -> int:
    metrics = entry.get("operationMetrics") or {}
    for key in ("numOutputRows", "numSourceRows"):
        if key in metrics:
            return int(metrics[key])
    return 0


def find_batch(loc: str, owner: Owner, batch_id: int) -> LakeVersion | None:
    """The version of the table that holds the batch, from its history (recent versions first)."""
    for limit in (HISTORY_WINDOW, None):
        entries = history(loc, limit)
        for entry in entries:
            meta = batch_of(entry.get("userMetadata"), owner)
            if meta is not None and meta.get("batch_id") == batch_id:
                return LakeVersion(int(entry["version"]), commit_rows(entry), int(meta.get("attempt") or 0))
        if limit is not None and len(entries) < limit:
            return None
    return None


def batch_versions(loc: str, owner: Owner) -> tuple[dict[int, list[int]], list[int]]:
    """Every batch id of `owner` that the table's retained history holds, with the versions that hold it; and
    the versions microbatch made for someone else (another ledger, pipeline or sink)."""
    found: dict[int, list[int]] = {}
    foreign: list[int] = []
    for entry in history(loc, None):
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
    return min(int(entry["version"]) for entry in history(loc, None))
