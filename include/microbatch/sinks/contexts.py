"""The values the phases hand a sink, and what a sink answers with: `Staging`, `StageContext`, `RelandContext`,
`PublishedRows`, `Outbox`, `PublishRun`, `TableView`, `AssetRef`, `LineagePlaces`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from microbatch.types import OffsetRange

if TYPE_CHECKING:
    from microbatch.ledger.database import Ledger


@dataclass(frozen=True)
class Staging:
    """What the stage writes for one sink: the job's output named after the sink, these columns, appended to
    `table` with `batch_id` and `attempt` in front."""

    table: str
    columns: tuple[str, ...]
    fix: str
    """What to change when the job's output lacks some of `columns`."""


@dataclass(frozen=True)
class StageContext:
    """The attempt being staged, as a sink that writes its table in the stage sees it."""

    pipeline: str
    pipeline_id: int
    pipeline_uid: str
    """The ledger's identity of the pipeline, which the table's commit carries."""
    batch_id: int
    attempt: int
    ranges: Sequence[OffsetRange]
    ledger: Ledger | None = None
    """The ledger, for a sink that makes its table's commit inside a ledger transaction (`write_table` sets it)."""


@dataclass(frozen=True)
class RelandContext(StageContext):
    """A committed batch that `microbatch reland` lands again into one append sink (`phases/reland.py`): its
    `attempt` is the one the batch was committed with, and the ledger is always given."""

    number: int = 1
    """1 for the batch's first reland into the sink, then 2, ..."""
    rows: int = 0
    """The rows the ledger committed for the sink, which the reland lands."""

    @property
    def owned_ledger(self) -> Ledger:
        assert self.ledger is not None, "a reland is given the ledger"
        return self.ledger

    @property
    def staged(self) -> dict[str, int]:
        """The parameters that select the reland's staged rows (tagged with the attempt -number)."""
        return {"batch_id": self.batch_id, "attempt": -self.number}


@dataclass(frozen=True)
class PublishedRows:
    """Rows of a sink that a publishing sink sends in this commit, as a SQL relation named `final`."""

    relation: str
    """`(SELECT ...) AS final`, or `final` when `ctes` defines it."""
    order: str
    """The columns that number the rows, so the outbox order is stable."""
    params: dict[str, Any]
    correction: bool = False
    """The rows correct values that were already published (a backfill or a replay changed them)."""
    ctes: str = ""
    """`WITH ... final AS (...) ` (with its trailing space) when `relation` is a common table expression."""
    label: str = "row(s)"
    """What the rows are, for the commit's log line (`<n> <label>: outbox <sink> seq a..b`)."""
    coordinates: bool = False
    """The rows carry their source `topic`, `partition` and `offset`, which the outbox keeps beside each."""
    replay_rows: str | None = None
    """A replay of rows: a SELECT of the rows it gives (with their coordinates); the outbox then takes only what
    changed against what was last published for the ranges it supersedes (`repository.outbox_row_changes_sql`)."""


@dataclass(frozen=True)
class TableView:
    """What `microbatch show` prints of a lakehouse table, read without Spark."""

    location: str
    version: int
    files: int
    total_rows: int
    columns: list[str]
    rows: list[tuple[Any, ...]]
    reader: str
    """What read the table (e.g. `delta-rs`)."""


@dataclass(frozen=True)
class AssetRef:
    """An Airflow Asset that a sink's output is (plain strings: sinks/ does not import Airflow)."""

    name: str
    uri: str


def table_asset(pipeline: str, table: str) -> AssetRef:
    """The asset of a table or topic of a pipeline, named after it as its URI is: a sink moved to another table is
    another asset (Airflow leaves an asset inactive while one name has two URIs)."""
    return AssetRef(name=f"microbatch.{pipeline}.{table}", uri=f"microbatch://{pipeline}/{table}")


@dataclass(frozen=True)
class LineagePlaces:
    """Where a batch's outputs live, as OpenLineage namespaces them (no credentials)."""

    postgres: str
    """`postgres://HOST:PORT` of the ledger's database, which holds the Postgres sink tables."""
    database: str
    kafka: str
    """`kafka://HOST:PORT` of the output topics."""


@dataclass(frozen=True)
class Outbox:
    """One publishing sink's outbox in the ledger, as the publish phase hands it to the sink's `publish`."""

    highest: int
    """The highest sequence the outbox holds."""
    pending: Callable[[int, int], list[tuple[int, str, dict]]]
    """The rows (seq, key, value) after a sequence, at most a number of them (a ledger transaction of its own)."""
    record_progress: Callable[[int], None]
    """Record that the topic holds every sequence up to one (a ledger transaction of its own; for operators)."""


@dataclass
class PublishRun:
    """What the producers of one publish task did, across failovers."""
    resumed_after: int | None = None  # the committed tail the first producer found
    last: int = 0
    transactions: int = 0
