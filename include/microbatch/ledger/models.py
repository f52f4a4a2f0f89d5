"""The offset ledger: SQLAlchemy 2 models. The schema itself comes from Alembic migrations."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB}


class BatchState(StrEnum):
    PLANNED = "planned"
    STAGED = "staged"
    COMMITTED = "committed"
    FAILED = "failed"
    ABANDONED = "abandoned"


OPEN_STATES = (BatchState.PLANNED.value, BatchState.STAGED.value)


class BatchKind(StrEnum):
    SCHEDULED = "scheduled"
    BACKFILL = "backfill"
    """Mode `fill`: offsets never committed, below the scheduled position."""
    REPLAY = "replay"
    """Mode `replay`: recomputes committed ranges and replaces their contribution."""


BACKFILL_KINDS = (BatchKind.BACKFILL.value, BatchKind.REPLAY.value)


class Pipeline(Base):
    """One row per pipeline; `state` is the pipeline state as of its last committed batch."""

    __tablename__ = "pipelines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    spec_hash: Mapped[str] = mapped_column(Text)
    uid: Mapped[str] = mapped_column(Text, server_default=text("gen_random_uuid()::text"))
    """This ledger's identity of the pipeline: a lakehouse table tells its batches from those of another ledger
    (or an earlier ledger of the same name) by it."""
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Position(Base):
    """The next offset to read, per pipeline and partition. Only moved by compare-and-set."""

    __tablename__ = "positions"

    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"), primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    next_offset: Mapped[int] = mapped_column(BigInteger)
    last_batch_id: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Batch(Base):
    """One micro-batch: planned ranges, attempts, staged counts, and the commit."""

    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"), index=True)
    kind: Mapped[str] = mapped_column(Text, default=BatchKind.SCHEDULED.value)
    state: Mapped[str] = mapped_column(Text, default=BatchState.PLANNED.value)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    staged_attempt: Mapped[int | None] = mapped_column(Integer)
    state_before: Mapped[dict[str, Any]] = mapped_column(default=dict)
    state_after: Mapped[dict[str, Any] | None] = mapped_column()
    counts: Mapped[dict[str, Any]] = mapped_column(default=dict)
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    airflow_run_id: Mapped[str | None] = mapped_column(Text)
    """The Airflow run that planned the batch."""
    run_head: Mapped[int | None] = mapped_column(BigInteger)
    """On a run's later batches (`source.max_batches_per_run`), the run's first batch; open scheduled batches of a
    pipeline all share one head (migration 0011)."""
    committed_run_id: Mapped[str | None] = mapped_column(Text)
    """The Airflow run whose commit task committed it (another run's, after a retry in a later run)."""
    error: Mapped[str | None] = mapped_column(Text)
    replaces: Mapped[list[int] | None] = mapped_column(JSONB)
    """Replay batches: the ids of the committed ranges this batch replaces."""
    formats: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """The pins of the sides read through a schema registry (`avro`), by side: subject, reader version and id (set
    by the plan; a replay's copied from the batch it replays) and, once staged, the writer schema ids met
    (migration 0016)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    staged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Range(Base):
    """The offsets [start_offset, end_offset) of one partition that a batch reads.

    Committed ranges of a partition never overlap: an exclusion constraint over
    `int8range(start_offset, end_offset)` (btree_gist) enforces it in the database.
    """

    __tablename__ = "ranges"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id"), index=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    start_offset: Mapped[int] = mapped_column(BigInteger)
    end_offset: Mapped[int] = mapped_column(BigInteger)
    committed: Mapped[bool] = mapped_column(Boolean, default=False)
    superseded_by: Mapped[int | None] = mapped_column(ForeignKey("batches.id"))
    """The replay batch that replaced this committed range (then no longer `committed`)."""


class LedgerGap(Base):
    """Offsets recorded as lost (retention deleted them before they were read)."""

    __tablename__ = "gaps"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    batch_id: Mapped[int | None] = mapped_column(ForeignKey("batches.id"))
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    start_offset: Mapped[int] = mapped_column(BigInteger)
    end_offset: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class DeadLetter(Base):
    """A record the job's parse refused (its `error`), kept with its source coordinates and raw bytes. The stage
    writes them to `stage_dead_letters` (same columns, tagged (batch_id, attempt), no primary key) and the commit
    moves them here. `key` and `timestamp` are the Kafka record's key and timestamp (migration 0013): NULL on
    dead letters written before it. `headers` (migration 0014) are the record's Kafka headers when the spec sets
    `source.include_headers`, else NULL: a JSON array of {"key": string, "value": base64 string or null}."""

    __tablename__ = "dead_letters"
    __table_args__ = (UniqueConstraint("pipeline_id", "topic", "partition", "offset", name="uq_dead_letters_source"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id"))
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(BigInteger)
    raw: Mapped[bytes | None] = mapped_column(LargeBinary)
    error: Mapped[str] = mapped_column(Text)
    key: Mapped[bytes | None] = mapped_column(LargeBinary)
    timestamp: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    headers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class LagSnapshot(Base):
    """What one plan saw of one partition: its start, the latest (stable) offset, and the lag before/after."""

    __tablename__ = "lag_snapshots"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    batch_id: Mapped[int | None] = mapped_column(ForeignKey("batches.id"))
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    start_offset: Mapped[int] = mapped_column(BigInteger)
    latest_offset: Mapped[int] = mapped_column(BigInteger)
    lag: Mapped[int] = mapped_column(BigInteger)
    lag_after: Mapped[int] = mapped_column(BigInteger)
    planned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class LakeCommit(Base):
    """Which version of a lakehouse table holds a batch: written by the stage right after the table's own
    commit, checked by the ledger's commit, kept after the table's history expires (the audit of `verify`)."""

    __tablename__ = "lake_commits"
    __table_args__ = (Index("ix_lake_commits_sink_version", "sink", "table_version"),)

    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id"), primary_key=True)
    sink: Mapped[str] = mapped_column(Text, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    """The attempt whose write made the version (a later attempt finds it and writes nothing)."""
    location: Mapped[str] = mapped_column(Text)
    table_version: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(BigInteger)
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RegistrySchema(Base):
    """A schema's text by its registry id, kept for the pipeline whose batches decoded with it (migration 0016)."""

    __tablename__ = "registry_schemas"

    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"), primary_key=True)
    schema_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    schema: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class LateRecord(Base):
    """A record for an event-time window that was already final when its batch began (Flink's late side output),
    kept with the watermark that made it late. The stage writes them to `stage_late_records`, the commit moves
    them here (migration 0002). `headers` as for a dead letter (migration 0014)."""

    __tablename__ = "late_records"
    __table_args__ = (UniqueConstraint("pipeline_id", "topic", "partition", "offset", name="uq_late_records_source"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id"))
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(BigInteger)
    event_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    raw: Mapped[bytes | None] = mapped_column(LargeBinary)
    watermark: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    headers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class OutboxRow(Base):
    """One record to publish to a kafka sink's topic, written by the commit; `seq` is gap-free per (pipeline,
    sink) and travels in a header (migration 0002)."""

    __tablename__ = "outbox"
    __table_args__ = (PrimaryKeyConstraint("pipeline_id", "sink", "seq", name="pk_outbox"),
                      CheckConstraint("seq > 0", name="seq_positive"),
                      Index("ix_outbox_source", "pipeline_id", "sink", "src_topic", "src_partition", "src_offset",
                            "seq", postgresql_where=text("src_topic IS NOT NULL")))

    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    sink: Mapped[str] = mapped_column(Text)
    seq: Mapped[int] = mapped_column(BigInteger)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id"))
    key: Mapped[str | None] = mapped_column(Text)
    value: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    src_topic: Mapped[str | None] = mapped_column(Text)
    """A published row's source coordinates (NULL for a window), so a replay publishes only what changed
    (migration 0015)."""
    src_partition: Mapped[int | None] = mapped_column(Integer)
    src_offset: Mapped[int | None] = mapped_column(BigInteger)


class PublishProgress(Base):
    """What the publisher of a sink last committed to Kafka. Informational: the topic's committed tail is the
    truth (migration 0002)."""

    __tablename__ = "publish_progress"
    __table_args__ = (PrimaryKeyConstraint("pipeline_id", "sink", name="pk_publish_progress"),)

    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    sink: Mapped[str] = mapped_column(Text)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    transactions: Mapped[int] = mapped_column(BigInteger, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class PositionReset(Base):
    """The audit row of an operator's `microbatch reset` of one position (migration 0004)."""

    __tablename__ = "position_resets"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    old_offset: Mapped[int | None] = mapped_column(BigInteger)
    new_offset: Mapped[int] = mapped_column(BigInteger)
    target: Mapped[str] = mapped_column(Text)
    operator: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class StateReset(Base):
    """The audit row of an operator's change of a pipeline's state, `microbatch reset --watermark` (migration
    0017)."""

    __tablename__ = "state_resets"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id"))
    old_state: Mapped[dict[str, Any]] = mapped_column()
    new_state: Mapped[dict[str, Any]] = mapped_column()
    target: Mapped[str] = mapped_column(Text)
    operator: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


def _bad_record_staging(name: str, *columns: Column[Any]) -> Table:
    """A staging table of the ledger's own: what the stage found bad, tagged (batch_id, attempt), no key."""
    return Table(
        name, Base.metadata,
        Column("batch_id", BigInteger, nullable=False), Column("attempt", Integer, nullable=False),
        Column("topic", Text, nullable=False), Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False), *columns,
        Index(f"ix_{name}_batch", "batch_id", "attempt"),
    )


STAGE_DEAD_LETTERS = _bad_record_staging(
    "stage_dead_letters", Column("raw", LargeBinary), Column("error", Text, nullable=False),
    Column("key", LargeBinary), Column("timestamp", DateTime(timezone=True)), Column("headers", Text))
"""The stage's dead letters of an attempt (migration 0001); the commit moves them to `dead_letters`. `headers` is
the JSON text that the commit casts to jsonb (Spark's JDBC writer sends strings as varchar)."""
STAGE_LATE_RECORDS = _bad_record_staging(
    "stage_late_records", Column("event_time", DateTime(timezone=True)), Column("raw", LargeBinary),
    Column("headers", Text))
"""The stage's late records of an attempt (migration 0002); the commit moves them to `late_records`."""
