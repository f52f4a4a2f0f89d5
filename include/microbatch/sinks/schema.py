"""The sink tables of a spec, as the spec says they are, against the database as it is.

Each sink defines its tables with `Sink.tables` (the sink table, its staging table, any side table); this module
compares them with the database through Alembic's autogenerate comparison, restricted to those tables, so the
ledger's own tables are never looked at.

- `apply` (`microbatch migrate`): creates missing tables and indexes and adds new nullable columns (a NOT NULL
  column only to an empty table). Anything else that differs (a column in the database that the spec no longer
  has, a changed type or nullability, a changed primary key) is refused with one sentence naming the table and
  the column, before anything is changed.
- `check` (the plan, before it opens a batch): refuses the batch with the same kind of sentence if anything the
  spec declares differs, and names `microbatch migrate` for what it would create.

A sink whose spec declares no columns (a `postgres_aggregate` without `columns`) has no tables here; its tables
must exist, and `check` verifies only that. Indexes, constraints and foreign keys that the database has beyond
the spec (an operator's own index) are left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.dialects import postgresql

from microbatch.column_types import COLUMN_TYPES
from microbatch.config import PipelineSpec, load_spec, spec_paths
from microbatch.errors import SpecError
from microbatch.ledger.database import MIGRATE_LOCK_NAMESPACE, get_engine, upgrade_ledger
from microbatch.sinks.base import Sink, quote, sql_type
from microbatch.sinks.capabilities import LakeTable
from microbatch.sinks.registry import sinks_of

log = logging.getLogger(__name__)

_AGAIN = "run microbatch migrate again"
_MAX_NAME = 63
_SPEC_TYPE_NAMES = COLUMN_TYPES


def sink_metadata(spec: PipelineSpec) -> sa.MetaData:
    """The tables of every sink of `spec`, as the spec declares them (plus the ledger's `batches` key that side
    tables reference, which is neither created nor compared)."""
    return metadata_of(spec, sinks_of(spec))


def metadata_of(spec: PipelineSpec, sinks: Mapping[str, Sink]) -> sa.MetaData:
    """`sink_metadata` of the spec's `sinks` (`registry.sinks_of`)."""
    metadata, by_sink = _tables_by_sink(sinks)
    _refuse_long_names(spec, sinks, by_sink)
    return metadata


def _tables_by_sink(sinks: Mapping[str, Sink]) -> tuple[sa.MetaData, dict[str, list[sa.Table]]]:
    """Every sink's tables, built once into one MetaData, and which sink defines which."""
    metadata = sa.MetaData()
    by_sink: dict[str, list[sa.Table]] = {}
    for name, sink in sinks.items():
        by_sink[name] = list(sink.tables(metadata))
    return metadata, by_sink


def _refuse_long_names(spec: PipelineSpec, sinks: Mapping[str, Sink], by_sink: Mapping[str, list[sa.Table]]) -> None:
    for name, tables in by_sink.items():
        for table in tables:
            names = [table.name, *(i.name for i in table.indexes), *(c.name for c in table.constraints)]
            too_long = next((n for n in names if isinstance(n, str) and len(n) > _MAX_NAME), None)
            if too_long:  # Postgres would cut it short, and the comparison would never match
                raise SpecError(f"{spec.name}: sink '{sinks[name].name}' needs the name {too_long}, longer than "
                                f"Postgres's {_MAX_NAME} characters; give the sink a shorter table name.")


def declared_tables(sinks: Mapping[str, Sink]) -> set[str]:
    """The names of the tables the sinks define (what migrate creates and compares)."""
    return {table.name for sink in sinks.values() for table in sink.tables(sa.MetaData())}


def required_tables(spec: PipelineSpec) -> list[str]:
    """Tables a sink uses but does not define (no `columns` in its spec): they must already exist."""
    return _undeclared(spec, declared_tables(sinks_of(spec)))


def _undeclared(spec: PipelineSpec, declared: set[str]) -> list[str]:
    """The tables the spec's sinks name that are not among the `declared` ones (`required_tables`). A lakehouse
    sink names no Postgres table: an iceberg sink's `table` is its catalog table's name."""
    names: list[str] = []
    for sink in sinks_of(spec).values():
        if isinstance(sink, LakeTable):
            continue
        for attribute in ("table", "staging_table", "contributions_table"):
            name = getattr(sink.spec, attribute, None)
            if isinstance(name, str) and name not in declared and name not in names:
                names.append(name)
    return names


@dataclass
class SchemaChanges:
    """What differs between the spec's sink tables and the database."""

    additive: list[str] = field(default_factory=list)
    """What `apply` does, one line each: `create table x`, `create index i on x`, `add column c to x`."""
    refused: list[str] = field(default_factory=list)
    """One sentence each: what differs that `apply` will not change, naming the table, the column, what to do."""
    _steps: list[Any] = field(default_factory=list, repr=False)

    def __bool__(self) -> bool:
        return bool(self.additive or self.refused)


def _type_name(type_: Any) -> str:
    """A column type as the spec spells it (`bigint`, `timestamptz`), else as Postgres does, lower-case."""
    dialect = postgresql.dialect()
    try:
        compiled = type_.compile(dialect=dialect)
    except Exception:  # a reflected type SQLAlchemy cannot render
        return str(type_).lower()
    for name in _SPEC_TYPE_NAMES:
        if sql_type(name).compile(dialect=dialect) == compiled:
            return name
    return compiled.lower()


def _has_rows(connection: sa.Connection, table: str) -> bool:
    return bool(connection.execute(sa.text(f"SELECT EXISTS (SELECT 1 FROM {quote(table)})")).scalar_one())


def plan_changes(connection: sa.Connection, metadata: sa.MetaData) -> SchemaChanges:
    """Compare `metadata`'s tables (only those; `batches` is a reference) with the database on `connection`."""
    names = {name for name in metadata.tables if name != "batches"}

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        if type_ == "schema":
            return name is None
        return name in names if type_ == "table" else True

    def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        return name in names if type_ == "table" else True

    context = MigrationContext.configure(connection, opts={
        "include_name": include_name, "include_object": include_object, "compare_type": True,
        "target_metadata": metadata,
    })
    changes = SchemaChanges()
    created: set[str] = set()
    for diff in _flatten(compare_metadata(context, metadata)):
        kind = diff[0]
        if kind == "add_table":
            table = metadata.tables[diff[1].name]  # Alembic's copy lacks the indexes
            created.add(table.name)
            changes.additive.append(f"create table {table.name}")
            changes._steps.append(sa.schema.CreateTable(table))
            changes._steps.extend(sa.schema.CreateIndex(index) for index in table.indexes)
        elif kind == "add_index":
            index = diff[1]
            if index.table.name not in created:
                changes.additive.append(f"create index {index.name} on {index.table.name}")
                changes._steps.append(sa.schema.CreateIndex(index))
        elif kind == "add_fk":
            fk = diff[1]
            if fk.table.name not in created:
                changes.additive.append(f"add the foreign key of {fk.table.name} to {fk.referred_table.name}")
                changes._steps.append(sa.schema.AddConstraint(fk))
        elif kind == "add_column":
            _, _, table_name, column = diff
            if column.nullable or not _has_rows(connection, table_name):
                changes.additive.append(f"add column {column.name} to {table_name}")
                changes._steps.append(_add_column(table_name, column))
            else:
                changes.refused.append(
                    f"sink table {table_name}: the spec adds column {column.name}, which is NOT NULL, but the table "
                    f"has rows; empty the table (or add the column with a value yourself) and {_AGAIN}")
        elif kind == "remove_column":
            _, _, table_name, column = diff
            changes.refused.append(
                f"sink table {table_name}: column {column.name} is in the database but not in the spec; add it back "
                f"to the spec's columns, or drop it yourself and {_AGAIN}")
        elif kind == "modify_type":
            _, _, table_name, column_name, _, existing, new = diff
            changes.refused.append(
                f"sink table {table_name}: column {column_name} is {_type_name(existing)} in the database but the "
                f"spec says {_type_name(new)}; change the spec back, or migrate the table yourself and {_AGAIN}")
        elif kind == "modify_nullable":
            _, _, table_name, column_name, _, existing, new = diff
            state = {True: "nullable", False: "NOT NULL"}
            changes.refused.append(
                f"sink table {table_name}: column {column_name} is {state[existing]} in the database but "
                f"{state[new]} in the spec; change the spec back, or alter the column yourself and {_AGAIN}")
        # remove_index, remove_constraint, remove_fk and the like: the database has more than the spec; left alone
    changes.refused[:0] = _primary_key_changes(connection, metadata, names - created)  # the cause comes first
    return changes


def _flatten(diffs: Iterable[Any]) -> Iterable[tuple[Any, ...]]:
    """Alembic groups the changes of one column in a list; one tuple per change."""
    for diff in diffs:
        if isinstance(diff, list):
            yield from diff
        else:
            yield diff


def _add_column(table: str, column: sa.Column) -> sa.TextClause:
    null = "" if column.nullable else " NOT NULL"
    ddl = column.type.compile(dialect=postgresql.dialect())
    return sa.text(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(column.name)} {ddl}{null}")


def _primary_key_changes(connection: sa.Connection, metadata: sa.MetaData, existing: set[str]) -> list[str]:
    """Alembic does not compare primary keys: a changed key is refused here."""
    inspector = sa.inspect(connection)
    refused = []
    for name in sorted(existing):
        declared = [c.name for c in metadata.tables[name].primary_key.columns]
        found = inspector.get_pk_constraint(name).get("constrained_columns") or []
        if declared != found:
            column = next((c for c in [*declared, *found] if c not in found or c not in declared), None)
            which = f" (column {column})" if column else ""
            refused.append(
                f"sink table {name}: its primary key is ({', '.join(found) or 'none'}) in the database but "
                f"({', '.join(declared) or 'none'}) in the spec{which}; change the spec's keys back, or rebuild the "
                f"table yourself and {_AGAIN}")
    return refused


def url_of(connection: sa.Connection) -> str:
    """The URL of the ledger database `connection` is to (with its password), for a lakehouse sink whose catalog
    lives there."""
    return connection.engine.url.render_as_string(hide_password=False)


def apply(connection: sa.Connection, spec: PipelineSpec) -> list[str]:
    """Bring the spec's sink tables to what it declares, inside the caller's transaction on `connection`;
    return what was done, one line each, and the tables it could not create (a sink without columns). A change
    it will not make raises `SpecError` before anything is done."""
    changes = plan_changes(connection, sink_metadata(spec))
    if changes.refused:
        raise SpecError(f"{spec.name}: {changes.refused[0]}.")
    lakes = [sink for sink in sinks_of(spec).values() if isinstance(sink, LakeTable)]
    for sink in lakes:  # refuse before anything is changed, here or in Postgres
        refused = sink.lake_refusal(url_of(connection))
        if refused:
            raise SpecError(f"{spec.name}: sink '{sink.name}': {refused}.")
    apply_changes(connection, changes)
    lake = [line for sink in lakes for line in sink.migrate_lake(url_of(connection))]
    inspector = sa.inspect(connection)
    missing = [name for name in required_tables(spec) if not inspector.has_table(name)]
    # Not an error here: the plan refuses the pipeline's batches until someone creates them.
    return [*changes.additive, *lake, *(f"not created: {name} (the spec declares no columns for it; declare them, or "
                                 "create the table yourself)" for name in missing)]


def apply_changes(connection: sa.Connection, changes: SchemaChanges) -> None:
    """Make the additive changes of `plan_changes`, in the caller's transaction; refuse if any was refused."""
    if changes.refused:
        raise SpecError(f"{changes.refused[0]}.")
    for step in changes._steps:
        connection.execute(step)


def check(connection: sa.Connection, spec: PipelineSpec) -> None:
    """Raise `SpecError` (terminal) with one sentence if the spec's sink tables are missing or differ from it."""
    check_sinks(connection, spec, sinks_of(spec))


def check_sinks(connection: sa.Connection, spec: PipelineSpec, sinks: Mapping[str, Sink]) -> None:
    """`check` of the spec's `sinks` (`registry.sinks_of`), each lakehouse table included. Each sink's tables are
    built once, for both the tables it must find and the comparison."""
    metadata, by_sink = _tables_by_sink(sinks)
    _require(connection, spec, {table.name for tables in by_sink.values() for table in tables})
    _refuse_long_names(spec, sinks, by_sink)
    changes = plan_changes(connection, metadata)
    if changes.refused:
        raise SpecError(f"{spec.name}: {changes.refused[0]}.")
    created = [line.removeprefix("create table ") for line in changes.additive if line.startswith("create table ")]
    if created:
        raise SpecError(f"{spec.name}: sink table {created[0]} does not exist; run `microbatch migrate`, which "
                        "creates the sink tables the spec declares.")
    if changes.additive:
        raise SpecError(f"{spec.name}: the sink tables lack what the spec declares ({'; '.join(changes.additive)}); "
                        "run `microbatch migrate`, which adds it.")
    for sink in sinks.values():
        if isinstance(sink, LakeTable):
            sink.check_lake(spec, url_of(connection))


def _require(connection: sa.Connection, spec: PipelineSpec, declared: set[str]) -> None:
    inspector = sa.inspect(connection)
    for name in _undeclared(spec, declared):
        if not inspector.has_table(name):
            raise SpecError(
                f"{spec.name}: sink table {name} does not exist and the spec declares no columns to create it from; "
                "declare the sink's columns and run `microbatch migrate`, or create the table yourself.")


def migrate_pipelines(connection: sa.Connection, directory: Path | None = None) -> dict[str, list[str]]:
    """`apply` for every spec in the pipelines directory, in one transaction on `connection`; what was done per
    pipeline. The first spec that cannot be read, or whose change is refused, raises and nothing is applied."""
    done: dict[str, list[str]] = {}
    for path in spec_paths(directory):
        spec = load_spec(path)
        done[spec.name] = apply(connection, spec)
        for line in done[spec.name]:
            log.info("%s: %s", spec.name, line)
    return done


def migrate_sinks(url: str, directory: Path | None = None) -> dict[str, list[str]]:
    """Create or extend the sink tables of every spec in the pipelines directory (`migrate_pipelines`), in one
    transaction; what was done per pipeline. A refused change raises `SpecError` and nothing is changed."""
    with get_engine(url).begin() as conn:
        # Two migrates at once would both find a table missing and both create it; the second waits instead.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:ns, 0)"), {"ns": MIGRATE_LOCK_NAMESPACE})
        return migrate_pipelines(conn, directory)


def migrate(url: str, revision: str = "head") -> str:
    """Upgrade the ledger schema with Alembic, then (at head) create or extend the sink tables of every spec in
    the pipelines directory; return the ledger revision."""
    current = upgrade_ledger(url, revision)
    if revision == "head":
        migrate_sinks(url)
    return current
