"""The ledger's record of lakehouse commits (`lake_commits`): which version of a sink's table holds a batch.

A lakehouse sink writes its table in the stage, as one idempotent table commit per batch, and the ledger's commit
refuses a batch whose version is not recorded here. `table_write` brackets that write: before it, an attempt that
is no longer the batch's current one is refused (a zombie never writes); after it, the version that holds the
batch is recorded. The record outlives the table's own history, for the audit of `microbatch verify`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from microbatch.errors import MicrobatchError, ZombieAttemptError
from microbatch.ledger.database import Ledger
from microbatch.ledger.models import Batch, BatchState, LakeCommit
from microbatch.types import TableWrite


@dataclass
class LakeWrite:
    """What the block inside `table_write` wrote: it sets `written` to the table version it made or found."""

    written: TableWrite | None = None


@contextmanager
def table_write(ledger: Ledger, pipeline_id: int, sink: str, batch_id: int, attempt: int) -> Iterator[LakeWrite]:
    """Around a lakehouse sink's write of the batch: first refuse (ZombieAttemptError, nothing written) unless
    `attempt` is the batch's current one and the batch is still planned; after the block, record which version
    holds the batch (`LakeWrite.written`). Each check is a transaction of its own; a block that raises records
    nothing, and the retry finds the version in the table's history."""
    with ledger.transaction() as session:
        refuse_zombie(session, sink, batch_id, attempt)
    write = LakeWrite()
    yield write
    if write.written is None:
        raise MicrobatchError(f"sink '{sink}': the write of batch {batch_id} returned no table version.",
                              fix="A sink's write_in_stage returns the version that holds the batch.")
    with ledger.transaction() as session:
        record_table_write(session, pipeline_id, sink, batch_id, attempt, write.written)


def refuse_zombie(session: Session, sink: str, batch_id: int, attempt: int) -> None:
    """Refuse (ZombieAttemptError) a table write by an attempt that is no longer the batch's current one, or of a
    batch that is no longer planned (staged, committed or abandoned since the attempt began)."""
    row = session.execute(select(Batch.state, Batch.attempt).where(Batch.id == batch_id)).one_or_none()
    if row is None:
        raise MicrobatchError(f"Batch {batch_id} does not exist in the ledger.", fix="Check the batch id.")
    state, current = row
    if current != attempt or state != BatchState.PLANNED.value:
        raise ZombieAttemptError(
            f"Batch {batch_id} is {state} at attempt {current}; attempt {attempt} "
            f"is a zombie and does not write {sink}.",
            fix="Let the newer attempt finish; this run wrote nothing to the table.")


def record_table_write(session: Session, pipeline_id: int, sink: str, batch_id: int, attempt: int,
                       found: TableWrite) -> None:
    """Keep which version holds the batch (a retry records the same version again); refuse a version that differs
    from the one recorded before."""
    recorded = record_lake_commit(session, pipeline_id, sink, batch_id, found.attempt or attempt, found.location,
                                  found.version, found.rows)
    if recorded != found.version:
        raise MicrobatchError(
            f"sink '{sink}': batch {batch_id} is recorded in version {recorded} of {found.location} and "
            f"found in version {found.version}.", fix="Run `microbatch verify`; the table holds the batch twice.")


def record_lake_commit(session: Session, pipeline_id: int, sink: str, batch_id: int, attempt: int, location: str,
                       version: int, rows: int) -> int:
    """Keep which version of a lakehouse table holds the batch (a retry records nothing new); the version the
    ledger holds for it now, which a caller compares with the one it found."""
    session.execute(
        insert(LakeCommit)
        .values(batch_id=batch_id, sink=sink, pipeline_id=pipeline_id, attempt=attempt, location=location,
                table_version=version, rows=rows)
        .on_conflict_do_nothing(index_elements=[LakeCommit.batch_id, LakeCommit.sink])
    )
    return session.scalars(select(LakeCommit.table_version).where(
        LakeCommit.batch_id == batch_id, LakeCommit.sink == sink)).one()


def lake_commit(session: Session, batch_id: int, sink: str) -> LakeCommit | None:
    """The recorded version of the sink's table that holds the batch, if any."""
    return session.scalars(
        select(LakeCommit).where(LakeCommit.batch_id == batch_id, LakeCommit.sink == sink)
    ).one_or_none()


def lake_versions(session: Session, pipeline_id: int, sink: str) -> dict[int, int]:
    """Every batch of the pipeline recorded in the sink's table: {batch id: table version}."""
    rows = session.execute(select(LakeCommit.batch_id, LakeCommit.table_version).where(
        LakeCommit.pipeline_id == pipeline_id, LakeCommit.sink == sink))
    return {batch_id: version for batch_id, version in rows}


def lake_versions_of_batch(session: Session, pipeline_id: int, batch_id: int) -> dict[str, tuple[str, int]]:
    """The table version per lakehouse sink that holds a batch: {sink: (location, version)}."""
    rows = session.execute(select(LakeCommit.sink, LakeCommit.location, LakeCommit.table_version).where(
        LakeCommit.pipeline_id == pipeline_id, LakeCommit.batch_id == batch_id))
    return {sink: (location, version) for sink, location, version in rows}
