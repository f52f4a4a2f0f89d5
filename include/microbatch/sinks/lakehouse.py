"""What the lakehouse sinks (`delta`, `iceberg`) share: where their tables live, the table commit's record of the
batch it holds, the fence of a table commit, the audit's expectation, the view's rows, and `LakehouseSink`, the
base class that answers for both whatever does not depend on the table format.

A lakehouse sink writes its table in the stage, as one commit per batch that names the batch (`commit_metadata`):
before writing it looks the batch up in the table, the commit is fenced against zombie attempts, and the version
(or snapshot) that holds the batch is recorded in the ledger (`lake_commits`); the ledger's commit then only checks
that record (`check_staged`) and takes its row count (`merge`). Each subclass keeps the table format's own part:
the write, the reland, the schema, the audit, the view and the maintenance.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy.orm import Session

from microbatch.config import SOURCE_COORDINATES, DeltaSink, IcebergSink
from microbatch.errors import MicrobatchError, SpecError
from microbatch.ledger import lake
from microbatch.ledger import repository as repo
from microbatch.ledger.models import BatchState
from microbatch.runtime import cache_dir
from microbatch.sinks.base import CommitContext, Sink
from microbatch.sinks.capabilities import LakeTable
from microbatch.sinks.contexts import Staging, table_asset
from microbatch.types import OffsetRange

if TYPE_CHECKING:
    from microbatch.ledger.database import Ledger
    from microbatch.sinks.contexts import AssetRef, LineagePlaces, RelandContext, StageContext, TableView

WAREHOUSE_ENV = "MICROBATCH_WAREHOUSE"


def warehouse() -> str:
    """Where lakehouse tables live unless a sink's `path` says otherwise: `$MICROBATCH_WAREHOUSE`, or
    `<cache>/warehouse`."""
    return os.environ.get(WAREHOUSE_ENV) or str(cache_dir() / "warehouse")


def location(sink: DeltaSink | IcebergSink) -> str:
    """The table's folder or URI: its `path`, else the sink's name, under the warehouse unless absolute."""
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


def expected_batches(states: Mapping[int, str], recorded: Mapping[int, Any]) -> list[int]:
    """The audit's batches that a table must hold: the committed ones since the sink's first recorded batch."""
    first = min(recorded, default=None)
    return sorted(b for b, state in states.items()
                  if state == BatchState.COMMITTED and first is not None and b >= first)


def view_rows(data: Any, limit: int, group_by: str | None, hidden: set[str] | frozenset[str] = frozenset()
              ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(columns, rows) of `microbatch show` from a table's Arrow `data`: the row count per value of `group_by`,
    largest first; else the newest rows by source coordinates, without the `hidden` columns."""
    import pyarrow.compute as pc

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
        columns = [c for c in newest.column_names if c not in hidden]
        rows = [tuple(r[c] for c in columns) for r in newest.to_pylist()]
    return columns, rows


class LakehouseSink(Sink, LakeTable):
    """A sink whose lakehouse table the stage writes (see the module's docstring); the ledger's commit checks that
    the version holding the batch is recorded, and commits it. A subclass names what holds a batch (`holding`) and
    the table (`table_name`), and implements the format's part."""

    holding: ClassVar[str] = "version"
    """What of the table holds a batch, in sentences: a `version`, a `snapshot`."""
    spec: DeltaSink | IcebergSink

    def __init__(self, spec: DeltaSink | IcebergSink) -> None:
        super().__init__(spec)
        columns = self.staged_columns()
        self.staging = Staging(table="", columns=columns,
                               fix=f"Return a DataFrame with the columns {', '.join(columns)} for it from outputs().")

    def staged_columns(self) -> tuple[str, ...]:
        """The columns the stage writes into the table: the source coordinates, then the spec's columns."""
        return (*SOURCE_COORDINATES, *self.spec.columns)

    @property
    def table_name(self) -> str:
        """The table, as the commit's refusal names it."""
        return self.lake_location

    def owner(self, ctx: StageContext) -> Owner:
        """Whose commits of the table this stage's are."""
        return Owner(ctx.pipeline, ctx.pipeline_uid, self.name)

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

    def lake_view(self, limit: int, group_by: str | None) -> TableView:
        if group_by is not None and group_by not in self.spec.columns:
            raise SpecError(f"Sink '{self.name}' has no column '{group_by}'.",
                            fix=f"Use one of: {', '.join(self.spec.columns)}.")
        return self.table_view(limit, group_by)

    def holding_text(self, location: str, version: int) -> str:
        return f"{self.type} {self.name}: in version {version} of {location}"

    def table_view(self, limit: int, group_by: str | None) -> TableView:
        """`lake_view` of the table, once `group_by` is known to be a column of it."""
        raise NotImplementedError

    def check_staged(self, session: Session, ctx: CommitContext, recorded: int) -> None:
        if lake.lake_commit(session, ctx.batch_id, self.name) is None:
            raise MicrobatchError(
                f"Batch {ctx.batch_id}: no {self.holding} of {self.table_name} is recorded for sink {self.name}.",
                fix=f"Nothing was committed; the retry stages the batch, which finds or writes its {self.holding}.")

    def merge(self, session: Session, ctx: CommitContext) -> int | None:
        recorded = lake.lake_commit(session, ctx.batch_id, self.name)
        assert recorded is not None, f"check_staged refuses a batch without a recorded {self.holding}"
        return recorded.rows

    def clear_staging(self, session: Session, ctx: CommitContext) -> None:
        return None
