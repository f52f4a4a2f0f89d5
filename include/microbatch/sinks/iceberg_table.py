"""`iceberg`'s table, through pyiceberg's SQL catalog in the ledger's database: its columns and their Iceberg
types, its schema and partition spec as the spec says them (`microbatch migrate` creates it or adds columns; the
plan refuses a batch while it differs), and its snapshots, whose summaries name the batch each holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from microbatch.config import IcebergSink, PipelineSpec
from microbatch.errors import SpecError
from microbatch.sinks.column_mappers import ICEBERG_TYPES, iceberg_type
from microbatch.sinks.lakehouse import Owner, batch_of, commit_metadata, location, microbatch_meta, warehouse

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table

CATALOG = "microbatch"
"""The catalog's name, the `catalog_name` of its rows in `iceberg_tables`."""
SUMMARY_KEY = "microbatch"
"""The snapshot summary's property that holds the batch."""

COORDINATES = {"topic": "text", "partition": "integer", "offset": "bigint"}


def identifier(sink: IcebergSink) -> tuple[str, str]:
    """(namespace, table) of the table in the catalog."""
    return sink.namespace, sink.table or sink.name


def table_columns(sink: IcebergSink) -> list[tuple[str, str]]:
    """(name, spec type) of every column of the table: the source coordinates, then the spec's columns."""
    return [*COORDINATES.items(), *sink.columns.items()]



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


def snapshot_summaries(table: Table) -> list[tuple[int, Mapping[str, str]]]:
    return [(s.snapshot_id, s.summary or {}) for s in table.snapshots()]


def find_batch(table: Table, owner: Owner, batch_id: int) -> LakeSnapshot | None:
    """The snapshot of the table that holds the batch (the first, if a broken table holds it twice)."""
    held = snapshots_by_batch(snapshot_summaries(table), owner)[0].get(batch_id)
    return held[0] if held else None

