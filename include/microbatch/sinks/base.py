"""The core interface of a sink type, called by the stage and the commit phases.

A sink type is a subclass of `Sink` that overrides only what it does; an optional capability is a mixin of
`sinks/capabilities.py` that the type subclasses too (`LakeTable`, `Publisher`), never a no-op here:

- **stage** (Spark, before the commit): `staging` names the table the stage writes the job's output for this
  sink to, tagged (batch_id, attempt), and the columns it takes from that output. `None`: nothing is staged.
  A `LakeTable` writes its table itself in `write_in_stage`, as one idempotent table
  commit; the stage calls `write_table(sink, ...)`, which brackets that write with the ledger's two checks
  (`ledger/lake.table_write`: a zombie attempt writes nothing, and the version that holds the batch is recorded).
- **backfill**: `check_replay` refuses a replay the sink cannot take, before anything is written.
- **commit** (one Postgres transaction, the caller's session; a sink never commits): in this order, for each
  sink of the pipeline in spec order, `check_staged`, then `retract` (replay batches only), then `merge`; later
  a `Publisher`'s `write_outbox`; last `clear_staging`.
- **publish**: a sink that others publish from answers `published_rows` with the rows that became
  publishable in this commit; a `Publisher` (kafka) reads them in `write_outbox`, and the publish phase
  (`phases/publish.py`, after the commit) has it send them in `publish`.
- **schema** (`microbatch migrate` and the plan check, sinks/schema.py): `tables` defines the sink's tables
  (the sink table, its staging table, any side table) on a SQLAlchemy `MetaData`; `[]`: it has none. A
  `LakeTable` migrates and checks its table itself (`lake_refusal`, `migrate_lake`, `check_lake`).

**Capabilities.** Code outside `sinks/` never asks a sink's type: it asks what the sink does (`table`,
`include_late`, `replays_whole_batches`, `assets`, `lineage_output`, `view_order`, ..., and whether it is a
`LakeTable` or a `Publisher`; docs/architecture.md has the table). A new sink type is a module
`sinks/<type>.py` with one `Sink` subclass whose `type` is the tag, and its spec model in the union of
`config.SinkSpec`; `registry` finds the module by the tag.

Every method takes the caller's session and runs set-based SQL inside Postgres; none commits or rolls back.
What the phases hand a sink, and its answers, are the values of `sinks/contexts.py` (importable from here too), but
`CommitContext`, which holds the pipeline's sinks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeEngine

from microbatch import failpoints
from microbatch.config import SOURCE_COORDINATES, SinkSpec
from microbatch.errors import MicrobatchError
from microbatch.ledger.fragments import staged_rows
from microbatch.ledger.lake import table_write
from microbatch.sinks.column_mappers import postgres_types
from microbatch.sinks.contexts import (
    AssetRef,
    LineagePlaces,
    Outbox,
    PublishedRows,
    PublishRun,
    RelandContext,
    StageContext,
    Staging,
    TableView,
    table_asset,
)
from microbatch.types import OffsetRange, TableWrite, micros_time

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from microbatch.ledger.database import Ledger

__all__ = [  # the contexts live in sinks/contexts.py; callers outside sinks/ import them from here
    "AFTER_LAKE_COMMIT", "BEFORE_LAKE_COMMIT", "AssetRef", "CommitContext", "LineagePlaces", "Outbox", "PublishRun",
    "PublishedRows", "RelandContext", "Sink", "StageContext", "Staging", "TableView", "quote", "sql_type",
    "staging_columns", "table_asset", "tombstone_sql", "watermark_timestamp", "write_table",
]

log = logging.getLogger(__name__)
BEFORE_LAKE_COMMIT = failpoints.point("stage.before_lake_commit")
"""Hit by a `LakeTable` right before its table's commit (after its data files, if it writes them first)."""
AFTER_LAKE_COMMIT = failpoints.point("stage.after_lake_commit")
"""Hit by a `LakeTable` right after its table's commit, before the ledger's record of it is committed."""


def quote(identifier: str) -> str:
    """A SQL identifier, double-quoted."""
    # Identifiers come from a validated spec (lower-case SQL identifiers); quoting is belt and braces.
    return '"' + identifier.replace('"', '""') + '"'


_SQL_TYPES: dict[str, Any] = postgres_types()


def tombstone_sql(sink: Any, alias: str, name: Callable[[str], str] = quote) -> str:
    """The upsert sinks' rule, as SQL over the record `alias`: true for a record that deletes its key, i.e. its
    `delete_column` is true, or its value columns (neither keys nor `order_by`) are all null. `name` quotes a
    column in the target's dialect."""
    values = [c for c in sink.columns if c not in sink.keys and c != sink.order_by]
    checks = [f"coalesce({alias}.{name(sink.delete_column)}, false)"] if sink.delete_column else []
    if values:
        checks.append("(" + " AND ".join(f"{alias}.{name(c)} IS NULL" for c in values) + ")")
    return " OR ".join(checks) if checks else "false"


def sql_type(column_type: str) -> TypeEngine[Any]:
    """The SQLAlchemy type of a spec's column type (one of `config.ColumnType`)."""
    try:
        return _SQL_TYPES[column_type]()
    except KeyError:
        raise ValueError(f"'{column_type}' is not a column type a sink supports") from None


def staging_columns() -> list[sa.Column[Any]]:
    """The two columns every staging table starts with: the batch and attempt that staged the row."""
    return [sa.Column("batch_id", sa.BigInteger, nullable=False), sa.Column("attempt", sa.Integer, nullable=False)]


def watermark_timestamp(micros: int | None) -> datetime | None:
    """A watermark of the pipeline state (microseconds since the epoch) as the timestamptz SQL compares; one that
    no time can hold (past year 9999) is one sentence, with the way out."""
    if micros is None:
        return None
    moment = micros_time(micros)
    if moment is None:
        raise MicrobatchError(
            f"The pipeline's watermark ({micros} µs since 1970) is past year 9999, which no table can hold; nothing "
            "was committed.",
            fix="`microbatch state PIPELINE` shows it; abandon the open batch, then `microbatch reset PIPELINE "
                "--watermark clear` (the event time column must be a timestamp: `unit: ms` for epoch milliseconds).")
    return moment


@dataclass(frozen=True)
class CommitContext:
    """The batch being committed, as every sink sees it inside the commit's transaction."""

    pipeline_id: int
    batch_id: int
    attempt: int
    backfill: bool
    """A backfill or replay batch: it never moves the scheduled cursor, and what it changes in windows that
    are already final is published again as corrections."""
    replay: bool
    """A replay batch: it supersedes committed ranges, whose contributions the sinks retract."""
    watermark_before: int | None
    watermark_after: int | None
    """The pipeline's watermark (microseconds) before and after this batch; a backfill leaves it unchanged."""
    sinks: Mapping[str, Sink]
    """Every sink of the pipeline by name, so one sink can publish another's rows."""

    @property
    def staged(self) -> dict[str, int]:
        """The parameters that select this batch's staged rows."""
        return {"batch_id": self.batch_id, "attempt": self.attempt}


class Sink:
    """A sink of one pipeline: its spec plus what the stage and the commit ask of every sink. Every default does
    nothing, so a sink type overrides only the steps it takes part in; an optional capability is a mixin of
    `sinks/capabilities.py` (`LakeTable`, `Publisher`)."""

    type: ClassVar[str]
    """The spec's `type` that selects this class (and names its module, `sinks/<type>.py`)."""
    staging: Staging | None = None
    spark_session_conf: ClassVar[Mapping[str, str]] = {}
    """Static settings that a Spark session staging this sink needs (a session extension, a catalog)."""
    row_audit: str | None = None
    """How `microbatch verify` checks a committed batch's rows (`phases/audit.py`): `coordinates`, an append sink
    whose rows in the batch's ranges must be the rows the stage handed it; `kept`, a sink whose commit keeps
    per-batch rows (`kept_rows`) that must still be there; None: offsets only."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    # --- capabilities ----------------------------------------------------------------------------------

    @property
    def table(self) -> str | None:
        """The Postgres table that readers query (in the ledger's database); None: the sink has none."""
        return None

    @property
    def include_late(self) -> bool:
        """The stage hands this sink's output the late records too (see `phases/stage.py`); an aggregate never
        takes them, so its windows that may be published stay final."""
        return False

    @property
    def replays_whole_batches(self) -> bool:
        """A replay must recompute every range of each batch it touches (the sink keeps one contribution per
        batch, not per range)."""
        return False

    @property
    def view_order(self) -> tuple[list[str], list[str]] | None:
        """`microbatch show` of the Postgres table: (ORDER BY terms, columns summed in the title); None: the sink
        has no Postgres table. By default the newest rows by source coordinates."""
        return None if self.table is None else (["topic", "partition", "offset DESC"], [])

    def assets(self, pipeline: str) -> list[AssetRef]:
        """The Airflow Assets the sink's output is: its Postgres table, by default, updated by the commit task (by
        the publish task for a `Publisher`)."""
        return [] if self.table is None else [table_asset(pipeline, self.table)]

    def lineage_output(self, places: LineagePlaces, rows_by_sink: Mapping[str, int],
                       outbox: Mapping[str, tuple[int, int]], staged: Mapping[str, int]) -> tuple[str, str, int] | None:
        """(namespace, name, rows this batch wrote) of the OpenLineage dataset the sink wrote; None: none. By
        default its Postgres table, with the rows its merge wrote (else those staged)."""
        if self.table is None:
            return None
        table = self.table if "." in self.table else f"public.{self.table}"
        rows = rows_by_sink.get(self.name, staged.get(self.name, 0))
        return places.postgres, f"{places.database}.{table}", int(rows)

    @classmethod
    def driver_env(cls) -> dict[str, str]:
        """Environment a Spark driver of any pipeline needs for this sink type (resolved in the task, so that the
        driver writes where the CLI reads)."""
        return {}

    def live_rows(self, session: Session, pipeline_id: int, ranges: Mapping[int, Sequence[OffsetRange]]
                  ) -> dict[int, int]:
        """`row_audit` sinks, for `microbatch verify`: the rows the sink holds now per batch of `ranges` (committed
        batches and their ranges), counted from its own table."""
        raise NotImplementedError(f"sink type {self.type} is not audited by its rows")

    def kept_rows(self, session: Session, ctx: CommitContext) -> int | None:
        """`kept` sinks, in the commit after `merge`: the rows kept for this batch, which the ledger records."""
        return None

    def replay_footprint(self, session: Session, keys: str) -> tuple[int, object, object] | None:
        """Before a replay: (rows, first window start, last window end) of what the replaced ranges contributed
        to this sink, `keys` the JSON list of {b: batch, t: topic, n: partition}; None: nothing to report."""
        return None

    # --- the batch protocol ------------------------------------------------------------------------------

    def tables(self, metadata: sa.MetaData) -> list[sa.Table]:
        """This sink's tables, defined on `metadata`: the sink table with its primary key and indexes, its
        staging table `stage_<table>` (`batch_id`, `attempt`, the staged columns, an index on both) and any side
        table. `microbatch migrate` creates what is missing; the plan refuses a batch while they differ."""
        return []

    def staged_rows(self, rows: DataFrame) -> DataFrame:
        """The job's output for this sink as the stage writes it (by default as the job returned it)."""
        return rows

    @property
    def takes_tombstones(self) -> bool:
        """An upsert sink keyed by the record key (`keys_from: record_key`), or an append sink that keeps them
        (`keep_tombstones`): the stage adds to its rows the batch's tombstones (`tombstone_rows`), which the job
        never sees."""
        return self.spec.keyed_by_record or self.spec.keeps_tombstones

    def tombstone_rows(self, tombstones: DataFrame, like: DataFrame) -> DataFrame:
        """`takes_tombstones` sinks: the deletes of the keys of `tombstones` (records with a key and a null value,
        their key decoded) as rows of `like`'s columns and types (the job's rows for this sink): the key columns
        from the decoded key, the order column from the record timestamp, every other column null (the upsert
        rule's delete: `tombstone_sql`), the delete column true, and the source coordinates."""
        from pyspark.sql import functions as F

        spec: Any = self.spec
        if not spec.keyed_by_record:  # kept as rows: the columns the tombstone has (its decoded key's), else null
            return tombstones.select(*[(F.col(name) if name in tombstones.columns else F.lit(None))
                                       .cast(like.schema[name].dataType).alias(name) for name in like.columns])
        special = {spec.order_by: F.col("timestamp"), spec.delete_column: F.lit(True)}

        def column(name: str) -> Any:
            taken = name in spec.keys or name in SOURCE_COORDINATES
            value = F.col(name) if taken else special.get(name, F.lit(None))
            return value.cast(like.schema[name].dataType).alias(name)

        return tombstones.select(*[column(name) for name in like.columns])

    def clear_reland(self, session: Session, ctx: RelandContext) -> None:
        """Postgres append sinks: delete what an earlier run of the same reland left staged."""
        raise NotImplementedError(f"sink type {self.type} cannot be relanded")

    def reland_staged(self, session: Session, ctx: RelandContext) -> int:
        """Postgres append sinks: replace the rows of the batch's ranges by the reland's staged rows, and delete
        those; the rows inserted."""
        raise NotImplementedError(f"sink type {self.type} cannot be relanded")

    def check_replay(self) -> None:
        """Refuse (one `SpecError` sentence) a backfill in mode `replay` that this sink cannot take."""
        return None

    def check_staged(self, session: Session, ctx: CommitContext, recorded: int) -> None:
        """Refuse to commit unless the staging table holds exactly the rows the stage recorded."""
        if self.staging is None:
            return
        found = session.execute(
            text(f"SELECT count(*) FROM {staged_rows(quote(self.staging.table))}"),
            ctx.staged,
        ).scalar_one()
        if found != recorded:
            raise MicrobatchError(
                f"Batch {ctx.batch_id} attempt {ctx.attempt}: {found} rows are staged for sink {self.name} "
                f"but the stage recorded {recorded}.",
                fix="Nothing was written; the retry stages the batch again.",
            )

    def retract(self, session: Session, ctx: CommitContext) -> int | None:
        """Replay only, before `merge`: take back what the ranges this batch supersedes wrote (rows touched)."""
        return None

    def merge(self, session: Session, ctx: CommitContext) -> int | None:
        """Move this batch's staged rows into the sink (rows written), finishing any retraction of a replay."""
        return None

    def published_rows(self, ctx: CommitContext) -> PublishedRows | None:
        """The rows of this sink that became publishable in this commit; None if there are none."""
        return None

    def clear_staging(self, session: Session, ctx: CommitContext) -> None:
        """Delete the batch's staged rows, of every attempt."""
        if self.staging is not None:
            session.execute(text(f"DELETE FROM {quote(self.staging.table)} WHERE batch_id = :batch_id"), ctx.staged)


class _WritesInStage(Protocol):
    """What `write_table` asks of a sink: a `capabilities.LakeTable`'s name and write (that module imports this
    one, so the mixin is not named here)."""

    @property
    def name(self) -> str: ...

    def write_in_stage(self, rows: DataFrame, ctx: StageContext) -> TableWrite: ...


def write_table(sink: _WritesInStage, rows: DataFrame, ledger: Ledger, ctx: StageContext) -> TableWrite:
    """The stage's write of a `LakeTable` sink: the sink writes the batch's `rows` into its table
    (`write_in_stage`) unless the attempt is no longer the batch's current one, and the ledger keeps which version
    holds the batch (`ledger/lake.table_write`, in transactions of its own); the version."""
    with table_write(ledger, ctx.pipeline_id, sink.name, ctx.batch_id, ctx.attempt) as write:
        started = time.monotonic()
        written = sink.write_in_stage(rows, replace(ctx, ledger=ledger))
        log.info("  %s: %s %s rows as version %s of %s (%.1fs)", sink.name,
                 "wrote" if written.wrote else f"found (written by attempt {written.attempt})", written.rows,
                 written.version, written.location, time.monotonic() - started)
        write.written = written
    return written
